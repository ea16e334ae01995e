"""The shape of one step: the ablation hook changes nothing in a production run, and a plain
step calls the data-parallel seam only where a collective is needed."""

from __future__ import annotations

import collections

import pytest
import torch

from fp8rl.config import config_from_dict
from fp8rl.step.ablations import LogProbHook, OracleClip, RatioNoise, UpdateHook
from fp8rl.step.parallel import SingleProcess
from fp8rl.step.records import MiniBatch
from fp8rl.step.step import run_step
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_step import parity_reward

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}


def _context(tmp_path, **sections):
    cfg = config_from_dict(tiny_config(tmp_path, **sections))
    return parity_reward(Trainer(cfg, progress=False))


@pytest.mark.parametrize(
    "sections,kind",
    [
        ({}, LogProbHook),
        ({"loss": {"clip_source": "bf16"}, "calibration": SHADOW}, OracleClip),
        (
            {"loss": {"ratio_noise": {"sd": 0.1, "corr": 0.5}}, "train": {"precision": "bf16"}},
            RatioNoise,
        ),
    ],
)
def test_each_run_gets_its_hook(tmp_path, sections, kind):
    assert type(_context(tmp_path, **sections).context().plan.hook) is kind


def test_the_production_hook_returns_what_it_is_given():
    hook, old, mask = LogProbHook(), torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool)
    assert hook.bf16_passes
    seen, ref, state = hook.old(None, old, mask, 0)
    assert seen is old and ref is None and state is None
    ref = torch.randn(2, 3)
    update = hook.update(None, None, torch.arange(2), 0, 0, ref)
    assert type(update) is UpdateHook
    lp, options = torch.randn(2, 3), {"dual_clip": 3.0}
    assert update.loss_inputs(lp, slice(0, 2), "ppo_clip", options) == (lp, "ppo_clip", options)
    assert update.shadow(torch.randn(2, 3)) is ref


class CountingProcess(SingleProcess):
    """SingleProcess that counts the calls of each seam."""

    def __init__(self):
        self.calls = collections.Counter()

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if callable(attr) and not name.startswith("_") and name in vars(SingleProcess):
            super().__getattribute__("calls")[name] += 1
        return attr


@pytest.mark.parametrize("shadow", [False, True])
def test_a_plain_step_reduces_its_metrics_once(tmp_path, shadow):
    sections = {"train": {"mini_batches": 3, "micro_batch_size": 2}}
    if shadow:
        sections.update(loss={"mode": "calibrated"}, calibration=SHADOW)
    trainer = _context(tmp_path, **sections)
    dp = trainer.dp = CountingProcess()
    result = run_step(trainer.context(), 0)
    updates = int(result.metrics["train/updates"])
    assert updates == 3
    c = dp.calls
    # once a step: the share, the metrics, the empty-batch check, the mini-batch layout
    assert c["share"] == c["mean_metrics"] == c["sum_int"] == 1
    assert c["row_offset"] == c["sum"] == 1
    # once an update: the loss and the metrics in one sum, the clip, the optimizer step
    assert c["sum_dict"] == c["clip_gradients"] == c["optimizer_step"] == updates
    assert c["finish_backward"] == updates
    assert c["unshard"] == 1 + updates  # before the rollout, before each update
    assert c["gather_rows"] == int(shadow)


def test_a_whole_batch_minibatch_holds_its_normalizers():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    mb = MiniBatch.whole(mask)
    assert mb.rows == [0, 1] and mb.total_rows == 2 and float(mb.total_tokens) == 3.0
    assert float(MiniBatch.whole(torch.zeros(1, 3, dtype=torch.bool)).total_tokens) == 1.0
