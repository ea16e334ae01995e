"""The shadow phase of a step: the rows of every rank gathered, then the shadow core
(`fp8rl.rl.shadow_core`: the BF16 shadow diagnostics and, for `calibrated`, the pool and the
refit; docs/rl.md, "Calibrated Clipping") and the per-response statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..rl.clipping import lower_clipped, ratio
from ..rl.shadow_core import shadow_phase

if TYPE_CHECKING:
    from .context import StepContext
    from .records import ShadowRows


def shadow_and_calibrate(
    ctx: StepContext, rows: ShadowRows, step: int, bounds: tuple[float, float]
) -> tuple[dict, list[dict] | None]:
    """`rows`: the update's rows of every rank (`ShadowRows.gathered`); `bounds`: the clip
    bounds this step's loss used."""
    adv = rows.advantages.unsqueeze(1).expand_as(rows.old_log_prob)
    metrics = shadow_phase(
        rows.log_prob,
        rows.old_log_prob,
        rows.log_prob_shadow,
        rows.old_log_prob_shadow,
        adv,
        rows.mask,
        state=ctx.calibration,
        step=step,
        bounds=bounds,
        observe=ctx.calibration.moves_bounds,
        entropy=rows.entropy,
    )
    responses = None
    if ctx.plan.response_stats and ctx.dp.is_main:
        r = ratio(rows.log_prob, rows.old_log_prob)
        r_shadow = ratio(rows.log_prob_shadow, rows.old_log_prob_shadow)
        responses = response_stats(r, r_shadow, adv, rows.mask, rows.entropy, bounds[0], step)
    return metrics, responses


def response_stats(r, r_shadow, adv, mask, entropy, lower: float, step: int) -> list[dict]:
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
            lower_clipped(r_shadow, adv, m, lower).any(1).float(),
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
