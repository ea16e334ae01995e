"""The host-sync budget of the update loop: at most 2 device-to-host reads per mini-batch.

Counted on the CPU with host_syncs.count_host_syncs (calls from fp8rl's code that would
make a GPU wait). With train.fp8_check_finite off, a mini-batch update reads back once:
the skip decision and all its metrics in one transfer.
"""

from __future__ import annotations

import pytest
import torch

from fp8rl.step import step as S
from fp8rl.step import update as U
from fp8rl.utils import host_list
from helpers_step import parity_reward, step_context
from host_syncs import count_host_syncs

BUDGET = 2  # per mini-batch update


def _prepared(shadow: bool, **sections):
    ctx = parity_reward(step_context(**sections))
    samples = ctx.prompts.for_step(0)
    batch = S.rollout(ctx, samples, 0)
    rewards, _ = S.score(ctx, batch, samples)
    adv, _, _ = S.advantages_for(ctx, rewards, batch)
    return ctx, S.prepare_update(ctx, batch, adv, shadow)


@pytest.mark.parametrize(
    "precision,mode,shadow,micro",
    [
        ("fp8-rowwise", "calibrated", True, 2),
        ("fp8-tensorwise", "dapo", False, 0),
        ("fp8-blockwise", "cispo", False, 3),
        ("bf16", "grpo", False, 1),
    ],
)
def test_a_mini_batch_update_reads_back_at_most_twice(precision, mode, shadow, micro):
    ctx, data = _prepared(
        shadow,
        loss={"mode": mode},
        train={
            "precision": precision,
            "mini_batches": 3,
            "micro_batch_size": micro,
            "fp8_check_finite": False,
        },
    )
    with count_host_syncs() as sites:
        bounds = ctx.calibration.clip_bounds
        _, metrics, skipped = U.update_policy(ctx, data, 0, shadow, bounds)
    updates = int(metrics["train/updates"])
    assert updates == 3 and skipped == 0
    assert sum(sites.values()) <= BUDGET * updates, dict(sites)
    assert (
        metrics["actor/grad_norm"] > 0 and "actor/clipfrac" in metrics
    )  # the metrics still arrive


def test_the_counter_sees_reads_back_in_fp8rl_code():
    # the FP8 finite check reads one flag per quantization: far over the budget, and counted
    ctx, data = _prepared(
        False,
        train={"precision": "fp8-rowwise", "mini_batches": 2, "fp8_check_finite": True},
    )
    with count_host_syncs() as sites:
        U.update_policy(ctx, data, 0, False, ctx.calibration.clip_bounds)
    assert sum(n for site, n in sites.items() if site.startswith("quantize.py")) > BUDGET * 2
    with count_host_syncs() as sites:
        n = data.batch.num_tokens  # int() of a sum
    assert n > 0 and sum(sites.values()) == 1


def test_host_list_refuses_a_tensor_off_the_host():
    assert host_list(torch.tensor([1, 2])) == [1, 2]
    with pytest.raises(ValueError, match="meta"):
        host_list(torch.zeros(2, device="meta"))
