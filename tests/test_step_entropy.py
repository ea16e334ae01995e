"""`rollout/entropy` from the trainer's old-log-prob pass, for an engine that leaves the entropy
out of its batch (`entropy=None`, as the vLLM engine does): no vLLM needed here, fp8rl's engine
with its entropy dropped stands in for it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fp8rl.rollout import RolloutBatch
from fp8rl.tasks import RewardResult
from helpers_rollout import hand_batch
from helpers_step import parity_reward, step_context, step_rows

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}


class NoEntropy:
    """An engine's generate with the entropy left out of the batch (the vLLM engine's)."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, params, *, generator=None):
        return replace(self.engine.generate(prompts, params, generator=generator), entropy=None)


def fp32_context(drop_entropy: bool = False, **sections):
    precision = {"rollout": {"precision": "fp32"}, "train": {"precision": "fp32"}}
    for k, v in sections.items():
        precision[k] = {**precision.get(k, {}), **v}
    ctx = parity_reward(step_context(**precision))
    return replace(ctx, engine=NoEntropy(ctx.engine)) if drop_entropy else ctx


def step_metrics(drop_entropy: bool, **sections) -> dict:
    ctx = fp32_context(drop_entropy, **sections)
    return step_rows(ctx)[0]


@pytest.mark.parametrize(
    "sections",
    [{}, {"loss": {"mode": "calibrated"}, "calibration": SHADOW, "log": {"response_stats": True}}],
)
def test_the_old_log_prob_pass_gives_the_entropy_the_engine_left_out(sections):
    # fp32 rollout and trainer: the same distribution, so the trainer's entropy of the sampled
    # tokens' positions is the engine's own up to float rounding
    own = step_metrics(False, **sections)
    left = step_metrics(True, **sections)
    assert left["rollout/entropy"] > 0
    assert math.isclose(left["rollout/entropy"], own["rollout/entropy"], rel_tol=1e-5)
    # the rest of the step (the same tokens, the same old log-probs) is unchanged
    for key in ("mismatch/kl_rollout_train", "actor/loss", "rollout/reward"):
        assert left[key] == own[key], key


def test_a_step_whose_filter_keeps_no_row_still_reports_the_entropy():
    rows = []
    for drop_entropy in (False, True):
        ctx = fp32_context(drop_entropy, loss={"mode": "dapo"})
        ctx.task.reward = lambda text, sample: RewardResult(1.0, {"parsed": True})  # no mix
        rows += step_rows(ctx)
    own, left = rows
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
