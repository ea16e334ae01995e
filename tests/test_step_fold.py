"""train.fold_old_log_probs (step/fold.py): with one update a step, the old log-probs are the
update forward's own. Against the recomputed step of the same seed: the same gradients, the
same old log-probs in the batch's row order, the same mismatch and TIS metrics; the steps an
extra reader of the old log-probs needs recompute them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fp8rl.step import step as S
from fp8rl.step import update as U
from fp8rl.step.fold import folded_data
from fp8rl.step.records import MiniBatch
from helpers_step import parity_reward, step_context, step_rows

FP32 = {"precision": "fp32"}
SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}
FOLDED = "train/old_log_probs_folded"


def context(fold: bool, train=None, **sections):
    train = {**FP32, "mini_batches": 1, "fold_old_log_probs": fold, **(train or {})}
    rollout = {**FP32, **sections.pop("rollout", {})}
    return parity_reward(step_context(rollout=rollout, train=train, **sections))


def step_inputs(ctx):
    """Step 0's batch and advantages, as run_step makes them (fp32: no rows filtered)."""
    samples = ctx.prompts.for_step(0)
    batch = S.rollout(ctx, samples, 0)
    rewards, _ = S.score(ctx, batch, samples)
    adv, _, _ = S.advantages_for(ctx, rewards, batch)
    return batch, adv


def grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


LOSSES = [  # TIS caps that bind on an FP8 rollout's mismatch
    {"mode": "grpo", "tis": False},
    {"mode": "grpo", "tis": True, "tis_level": "sequence", "tis_cap": 1.02},
    {"mode": "dapo", "tis": True, "tis_mode": "mask", "tis_cap": 1.02},
]


@pytest.mark.parametrize("loss", LOSSES)
def test_a_folded_update_has_the_recomputed_gradients_and_old_log_probs(loss):
    # micro-batches of 3 rows: each micro-batch makes its own old log-probs and TIS weights;
    # an FP8 rollout (the trainer in fp32) gives TIS a mismatch to correct
    train, rollout = {"micro_batch_size": 3}, {"precision": "fp8-rowwise"}
    ref = context(False, train, loss=loss, rollout=rollout)
    got = context(True, train, loss=loss, rollout=rollout)
    batch, adv = step_inputs(ref)
    data_ref = S.prepare_update(ref, batch, adv, False)
    data_got = folded_data(got.plan, batch, adv)
    mask = batch.response_mask
    bounds = ref.calibration.clip_bounds
    # mini-batch rows in the step's shuffled order: the fill must undo the permutation
    perm = torch.randperm(len(batch), generator=ref.seeds.generator(0, "shuffle"))
    assert not torch.equal(perm, torch.arange(len(batch)))
    mb = MiniBatch(perm.tolist(), len(batch), mask.float().sum())
    for ctx, data in ((ref, data_ref), (got, data_got)):
        U.forward_backward(U.update_context(ctx, bounds), data, mb, None, U._PLAIN)
    g_ref, g_got = grads(ref.model), grads(got.model)
    assert g_ref.keys() == g_got.keys() and len(g_ref) > 0
    assert sum(g.abs().sum() for g in g_ref.values()) > 0
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], rtol=1e-5, atol=1e-7, msg=name)
    # the whole update: the old log-probs filled in the batch's row order, TIS as recomputed
    U.update_policy(got, data_got := folded_data(got.plan, batch, adv), 0, False, bounds)
    m = mask.bool()
    torch.testing.assert_close(data_got.old_log_probs[m], data_ref.old_log_probs[m])
    if loss["tis"]:
        torch.testing.assert_close(data_got.tis, data_ref.tis, rtol=1e-5, atol=1e-6)
        assert data_ref.metrics["actor/tis_clipfrac"] > 0  # a cap that binds: a real test
        for key, want in data_ref.metrics.items():
            torch.testing.assert_close(data_got.metrics[key], want, rtol=1e-5, atol=1e-6)


def test_a_folded_step_matches_the_recomputed_one_and_clips_nothing():
    loss = {"mode": "grpo", "eps_low": 1e-9, "eps_high": 1e-9}  # any ratio off 1 would clip
    rows = {}
    for fold in (False, True):
        ctx = context(fold, loss=loss)
        (rows[fold],) = step_rows(ctx)
    ref, got = rows[False], rows[True]
    assert got[FOLDED] == 1.0 and FOLDED not in ref  # the metric only where the key is on
    assert got["actor/ratio_mean"] == 1.0
    assert got["actor/clipfrac"] == got["actor/ppo_kl"] == 0.0
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "mismatch/kl_rollout_train"):
        assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-7), key
    assert ref["actor/grad_norm"] > 0


class NoEntropy:
    """An engine that leaves the entropy to the old-log-prob pass (the vLLM engine's)."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, params, *, generator=None):
        return replace(self.engine.generate(prompts, params, generator=generator), entropy=None)


@pytest.mark.parametrize(
    "case,sections",
    [
        ("shadow step", {"loss": {"mode": "calibrated"}, "calibration": SHADOW}),
        ("diagnostics", {"loss": {"mode": "grpo"}, "calibration": SHADOW}),
        ("ratio noise", {"loss": {"ratio_noise": {"sd": 0.05, "corr": 0.5}}}),
        ("engine without entropy", {}),
    ],
)
def test_steps_with_another_reader_of_the_old_log_probs_recompute_them(case, sections):
    ctx = context(True, **sections)
    if case == "engine without entropy":
        ctx = replace(ctx, engine=NoEntropy(ctx.engine))
    row = S.run_step(ctx, 0).metrics
    assert row[FOLDED] == 0.0
    assert float(row["actor/ratio_mean"]) > 0  # the updates ran
