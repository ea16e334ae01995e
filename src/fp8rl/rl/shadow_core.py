"""The shadow phase of a step, written once for the Trainer, the TRL trainer and the verl worker
(docs/rl.md, "Diagnostics" and "Calibrated Clipping").

Its inputs are a shadow step's FP8 log-probs (old and current), their BF16 shadows (the same
weights with quantization off), the advantages, the mask and the clip bounds the loss used:
  - `shadow_diagnostics`: the `shadow/*` metrics: FP8 against BF16 clipping and errors
    (`shadow_metrics`), the per-pass noise S and C (`estimate_noise`), given entropies the
    high-entropy share of the lower clips, and at the sequence level (GSPO) the same
    comparison of the sequence ratios (`sequence_shadow_metrics`, `shadow/seq_*`);
  - `observe_shadow`: the ratios fed to the `CalibrationState` (its pool and, at its refit
    steps, a refit); a refit's result comes back as `calib/*` metrics whose new bounds are
    named `calib/next_lower` and `calib/next_upper`, since `calib/lower` and `calib/upper`
    stay the bounds this step used and the new ones apply from the next step;
  - `shadow_phase`: both on one batch, as the Trainer and the verl worker run them, at the
    state's ratio level (`level_ratios`: token ratios, or one sequence ratio per response).
Where the tensors come from, gathering them across ranks and per-response statistics are the
callers' business: the core sees tensors only.
"""

from __future__ import annotations

import torch

from ._shapes import as_bool_mask, broadcast_advantages, require_2d
from .calibration import CalibrationResult
from .calibration_state import CalibrationState
from .clipping import ratio, row_advantages, sequence_ratio
from .diagnostics import high_entropy_lower_clip_share, sequence_shadow_metrics, shadow_metrics
from .loss_modes import RatioLevel, as_member
from .noise import estimate_noise

NEXT_BOUNDS = {"calib/lower": "calib/next_lower", "calib/upper": "calib/next_upper"}


def shadow_diagnostics(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob_shadow: torch.Tensor,
    old_log_prob_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bounds: tuple[float, float],
    nominal: tuple[float, float],
    entropy: torch.Tensor | None = None,
    level: RatioLevel | str = RatioLevel.TOKEN,
) -> dict:
    """The `shadow/*` metrics as detached 0-d tensors. (B, T) rows or flat token vectors;
    `entropy` (B, T) adds `shadow/high_entropy_lower_clip_share`, which needs rows, and
    level="sequence" the `shadow/seq_*` metrics of GSPO's sequence ratios (rows too)."""
    args = (log_prob, old_log_prob, log_prob_shadow, old_log_prob_shadow, advantages, mask)
    metrics = shadow_metrics(*args, bounds=bounds, nominal=nominal)
    if as_member(RatioLevel, level, "ratio level") is RatioLevel.SEQUENCE:
        metrics.update(sequence_shadow_metrics(*args, bounds=bounds, nominal=nominal))
    metrics.update(
        estimate_noise(old_log_prob, old_log_prob_shadow, log_prob, log_prob_shadow, mask)
    )
    if entropy is not None:
        metrics["shadow/high_entropy_lower_clip_share"] = high_entropy_lower_clip_share(
            ratio(log_prob, old_log_prob), advantages, mask, entropy, bounds[0]
        )
    return metrics


def refit_metrics(result: CalibrationResult) -> dict[str, float]:
    """A refit's `calib/*` metrics, its bounds named as the next step's (`calib/next_*`)."""
    metrics = result.metrics()
    next_bounds = {new: metrics.pop(old) for old, new in NEXT_BOUNDS.items()}
    return {**metrics, **next_bounds}


def observe_shadow(
    state: CalibrationState,
    step: int,
    r: torch.Tensor,
    r_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """`state.observe` on the step's FP8 ratios `r` and BF16 shadow ratios `r_shadow` (the whole
    global batch, so every rank refits alike): `refit_metrics` at a refit step, else {}."""
    result = state.observe(step, r, r_shadow, advantages, mask)
    return {} if result is None else refit_metrics(result)


def level_ratios(
    level: RatioLevel | str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob_shadow: torch.Tensor,
    old_log_prob_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r, r_shadow, advantages, mask) of the ratios a loss at this level clips: per token, or
    (sequence) one GSPO ratio, advantage (its tokens' mean) and flag per (B, T) row."""
    r, r_shadow = ratio(log_prob, old_log_prob), ratio(log_prob_shadow, old_log_prob_shadow)
    if as_member(RatioLevel, level, "ratio level") is RatioLevel.TOKEN:
        return r, r_shadow, advantages, mask
    require_2d("log_prob", log_prob, "level='sequence' (responses are rows)")
    m = as_bool_mask(mask)
    adv = broadcast_advantages(advantages.detach(), log_prob, "log_prob")
    return (
        sequence_ratio(log_prob, old_log_prob, m),
        sequence_ratio(log_prob_shadow, old_log_prob_shadow, m),
        row_advantages(adv, m),
        m.any(-1),
    )


def shadow_phase(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob_shadow: torch.Tensor,
    old_log_prob_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    state: CalibrationState,
    step: int,
    bounds: tuple[float, float],
    observe: bool = True,
    entropy: torch.Tensor | None = None,
) -> dict:
    """`shadow_diagnostics` (against the state's nominal bounds) and, with `observe`, the
    ratios fed to the state (`observe_shadow`): one dict of metrics, both at the state's
    ratio level (`state.level`)."""
    metrics = shadow_diagnostics(
        log_prob,
        old_log_prob,
        log_prob_shadow,
        old_log_prob_shadow,
        advantages,
        mask,
        bounds=bounds,
        nominal=state.nominal,
        entropy=entropy,
        level=state.level,
    )
    if observe:
        args = (log_prob, old_log_prob, log_prob_shadow, old_log_prob_shadow, advantages, mask)
        metrics.update(observe_shadow(state, step, *level_ratios(state.level, *args)))
    return metrics
