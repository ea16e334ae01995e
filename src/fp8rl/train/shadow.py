"""The shadow phase of a step: the rows of every rank gathered, then the shadow core
(`fp8rl.rl.shadow_core`: the BF16 shadow diagnostics and, for `calibrated`, the pool and the
refit; docs/rl.md, "Calibrated Clipping") and the per-response statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..rl.clipping import lower_clipped, ratio
from ..rl.shadow_core import shadow_phase
from .context import StepContext

if TYPE_CHECKING:
    from .step_records import StepData


def shadow_and_calibrate(
    ctx: StepContext, data: StepData, pooled: dict, step: int, bounds: tuple[float, float]
) -> tuple[dict, list[dict] | None]:
    """`bounds`: the clip bounds this step's loss used."""
    g = gathered_rows(ctx, data, pooled)
    old, mask, entropy = g["old"], g["mask"], g["entropy"]
    adv = g["adv"].unsqueeze(1).expand_as(old)
    metrics = shadow_phase(
        g["log_prob"],
        old,
        g["log_prob_ref"],
        g["old_ref"],
        adv,
        mask,
        state=ctx.calibration,
        step=step,
        bounds=bounds,
        observe=ctx.calibration.moves_bounds,
        entropy=entropy,
    )
    responses = None
    if ctx.cfg.log.response_stats and ctx.dp.is_main:
        r, r_ref = ratio(g["log_prob"], old), ratio(g["log_prob_ref"], g["old_ref"])
        responses = response_stats(r, r_ref, adv, mask, entropy, bounds[0], step)
    return metrics, responses


def gathered_rows(ctx: StepContext, data: StepData, pooled: dict) -> dict:
    """The update's rows of every rank: calibration and the diagnostics see the global batch."""
    idx = torch.cat(pooled["index"])
    return ctx.dp.gather_rows(
        {
            "log_prob": torch.cat(pooled["log_prob"]),
            "log_prob_ref": torch.cat(pooled["log_prob_ref"]),
            "old": data.old_log_probs[idx],
            "old_ref": data.old_log_probs_ref[idx],
            "mask": data.batch.response_mask[idx],
            "adv": data.advantages[idx],
            "entropy": data.batch.entropy[idx],
        }
    )


def response_stats(r, r_ref, adv, mask, entropy, lower: float, step: int) -> list[dict]:
    """One row per response: its mean token entropy, length, advantage, and whether any of
    its tokens was lower-clipped under the FP8 ratio and under the BF16 shadow's (read back
    once, after the updates)."""
    m = mask.bool()
    length = m.sum(1)
    stats = torch.stack(
        [
            torch.where(m, entropy.float(), 0).sum(1) / length.clamp_min(1),
            length.float(),
            adv[:, 0].float(),
            lower_clipped(r, adv, m, lower).any(1).float(),
            lower_clipped(r_ref, adv, m, lower).any(1).float(),
        ],
        1,
    ).tolist()
    return [
        {
            "step": step,
            "entropy": e,
            "length": int(n),
            "adv": a,
            "lower_clip_fp8": bool(f),
            "lower_clip_bf16": bool(b),
        }
        for e, n, a, f, b in stats
    ]
