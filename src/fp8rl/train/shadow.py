"""The shadow phase of a step: the BF16 shadow diagnostics on the global batch and, for
`calibrated`, the pool and the refit (docs/rl.md, "Calibrated Clipping")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..rl.clipping import lower_clipped, ratio
from ..rl.diagnostics import high_entropy_lower_clip_share, shadow_metrics
from ..rl.noise import estimate_noise
from .context import StepContext

if TYPE_CHECKING:
    from .step import StepData


def shadow_and_calibrate(
    ctx: StepContext, data: StepData, pooled: dict, step: int, bounds: tuple[float, float]
) -> tuple[dict, list[dict] | None]:
    """`bounds`: the clip bounds this step's loss used."""
    idx = torch.cat(pooled["index"])
    # Calibration and the diagnostics run on the global batch: every rank gathers all rows
    g = ctx.dp.gather_rows(
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
    log_prob, log_prob_ref, old, old_ref, mask = (
        g["log_prob"],
        g["log_prob_ref"],
        g["old"],
        g["old_ref"],
        g["mask"],
    )
    adv = g["adv"].unsqueeze(1).expand_as(old)
    calibration = ctx.calibration
    metrics = shadow_metrics(
        log_prob, old, log_prob_ref, old_ref, adv, mask, bounds=bounds, nominal=calibration.nominal
    )
    r, r_ref = ratio(log_prob, old), ratio(log_prob_ref, old_ref)
    metrics.update(estimate_noise(old, old_ref, log_prob, log_prob_ref, mask))
    metrics["shadow/high_entropy_lower_clip_share"] = high_entropy_lower_clip_share(
        r, adv, mask, g["entropy"], bounds[0]
    )
    if ctx.cfg.loss.table.bounds == "calibrated":
        result = calibration.observe(step, r, r_ref, adv, mask)
        if result is not None:  # a refit step
            # calib/lower and calib/upper stay the bounds this step used; the new ones apply next
            new = result.metrics()
            new["calib/next_lower"], new["calib/next_upper"] = (
                new.pop("calib/lower"),
                new.pop("calib/upper"),
            )
            metrics.update(new)
    responses = None
    if ctx.cfg.log.response_stats and ctx.dp.is_main:
        responses = response_stats(r, r_ref, adv, mask, g["entropy"], bounds[0], step)
    return metrics, responses


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
