"""The shape of one step: the ablation hook changes nothing in a production run, and a plain
step calls the data-parallel seam only where a collective is needed."""

from __future__ import annotations

import collections
from dataclasses import replace

import pytest
import torch

from fp8rl.step.ablations import LogProbHook, OracleClip, RatioNoise, UpdateHook
from fp8rl.step.parallel import SingleProcess
from fp8rl.step.records import MiniBatch
from fp8rl.step.step import run_step
from helpers_step import parity_reward, step_context

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}


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
def test_each_run_gets_its_hook(sections, kind):
    assert type(step_context(**sections).plan.hook) is kind


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
def test_a_plain_step_reduces_its_metrics_once(shadow):
    sections = {"train": {"mini_batches": 3, "micro_batch_size": 2}}
    if shadow:
        sections.update(loss={"mode": "calibrated"}, calibration=SHADOW)
    dp = CountingProcess()
    result = run_step(parity_reward(step_context(dp=dp, **sections)), 0)
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


@pytest.mark.parametrize("sections", [{}, {"loss": {"mode": "calibrated"}, "calibration": SHADOW}])
def test_a_context_built_from_its_pieces_steps_as_the_trainers(tmp_path, sections):
    # the step tests build their context with helpers_step.step_context, not a Trainer: the
    # same step, to the last bit, or those tests would test another wiring than a run's
    from fp8rl.config import config_from_dict
    from fp8rl.train.trainer import Trainer
    from helpers_config import tiny_config

    trainer = Trainer(config_from_dict(tiny_config(tmp_path, **sections)), progress=False)
    contexts = (parity_reward(trainer).context(), parity_reward(step_context(**sections)))
    plans = [replace(ctx.plan, hook=type(ctx.plan.hook)) for ctx in contexts]  # a new hook each
    assert plans[0] == plans[1]
    rows = [run_step(ctx, 0).metrics for ctx in contexts]
    keys = {k for k in rows[0] if not k.startswith("time/")}
    assert keys == {k for k in rows[1] if not k.startswith("time/")} and "actor/loss" in keys
    for k in sorted(keys):
        assert float(rows[1][k]) == float(rows[0][k]), k
    for a, b in zip(*(ctx.model.parameters() for ctx in contexts), strict=True):
        assert torch.equal(a, b)
