"""`rollout/entropy` from the trainer's old-log-prob pass, for an engine that leaves the entropy
out of its batch (`entropy=None`, as the vLLM engine does): no vLLM needed here, fp8rl's engine
with its entropy dropped stands in for it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fp8rl.config import config_from_dict
from fp8rl.rollout import RolloutBatch
from fp8rl.step.step import run_step
from fp8rl.tasks import RewardResult
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_rollout import hand_batch
from helpers_step import parity_reward

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}


class NoEntropy:
    """An engine's generate with the entropy left out of the batch (the vLLM engine's)."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, params, *, generator=None):
        return replace(self.engine.generate(prompts, params, generator=generator), entropy=None)


def trainer(tmp_path, **sections):
    precision = {"rollout": {"precision": "fp32"}, "train": {"precision": "fp32"}}
    for k, v in sections.items():
        precision[k] = {**precision.get(k, {}), **v}
    return parity_reward(Trainer(config_from_dict(tiny_config(tmp_path, **precision))))


def step_metrics(tmp_path, drop_entropy: bool, **sections) -> dict:
    t = trainer(tmp_path, **sections)
    if drop_entropy:
        t.engine = NoEntropy(t.engine)
    return {k: float(v) for k, v in run_step(t.context(), 0).metrics.items()}


@pytest.mark.parametrize(
    "sections",
    [{}, {"loss": {"mode": "calibrated"}, "calibration": SHADOW, "log": {"response_stats": True}}],
)
def test_the_old_log_prob_pass_gives_the_entropy_the_engine_left_out(tmp_path, sections):
    # fp32 rollout and trainer: the same distribution, so the trainer's entropy of the sampled
    # tokens' positions is the engine's own up to float rounding
    own = step_metrics(tmp_path / "own", False, **sections)
    left = step_metrics(tmp_path / "left", True, **sections)
    assert left["rollout/entropy"] > 0
    assert math.isclose(left["rollout/entropy"], own["rollout/entropy"], rel_tol=1e-5)
    # the rest of the step (the same tokens, the same old log-probs) is unchanged
    for key in ("mismatch/kl_rollout_train", "actor/loss", "rollout/reward"):
        assert left[key] == own[key], key


def test_a_step_whose_filter_keeps_no_row_still_reports_the_entropy(tmp_path):
    t = trainer(tmp_path, loss={"mode": "dapo"})
    t.task.reward = lambda text, sample: RewardResult(1.0, {"parsed": True})  # no mixed group
    own = {k: float(v) for k, v in run_step(t.context(), 0).metrics.items()}
    t = trainer(tmp_path / "left", loss={"mode": "dapo"})
    t.task.reward = lambda text, sample: RewardResult(1.0, {"parsed": True})
    t.engine = NoEntropy(t.engine)
    left = {k: float(v) for k, v in run_step(t.context(), 0).metrics.items()}
    assert own["train/skipped_empty_batch"] == left["train/skipped_empty_batch"] == 1.0
    assert math.isclose(left["rollout/entropy"], own["rollout/entropy"], rel_tol=1e-5)


def test_a_batch_without_entropy_keeps_it_none_through_select_to_and_concat():
    b = replace(hand_batch(), entropy=None)
    assert b.select([2, 0]).entropy is None and b.to("cpu").entropy is None
    c = RolloutBatch.concat([b, b.select([1])])
    assert c.entropy is None and c.log_probs.shape == (4, 2)
    mixed = RolloutBatch.concat([hand_batch(), b])  # one batch without: none for the whole
    assert mixed.entropy is None
    full = RolloutBatch.concat([hand_batch(), hand_batch()])
    assert torch.equal(full.entropy[3:], hand_batch().entropy)
