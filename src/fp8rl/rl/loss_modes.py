"""The loss modes of `loss.mode`: one table that config validation, the step and the docs read.

A mode names a registered policy loss (rl/losses.py) and says how its clip bounds and
defaults are chosen; adding a mode is one entry here (and a loss, if it needs a new one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossMode:
    name: str  # the value of loss.mode
    loss: str  # the registered policy loss (rl.losses.POLICY_LOSSES)
    # where the clip bounds come from: "nominal" (1 - eps_low, 1 + eps_high), "relaxed"
    # (loss.relaxed_lower, 1 + eps_high) or "calibrated" (the CalibrationState's bounds)
    bounds: str = "nominal"
    eps_high: float = 0.2  # the default of loss.eps_high (eps_low defaults to 0.2 everywhere)
    agg: str = "seq-mean-token-mean"  # the default of loss.agg
    dynamic_sampling: bool = False  # the default of loss.dynamic_sampling
    # loss keyword -> the loss config field that feeds it (None values are left out)
    options: tuple[tuple[str, str], ...] = ()
    summary: str = ""  # one line for docs and --help


_DUAL = (("dual_clip", "dual_clip"),)

LOSS_MODES: dict[str, LossMode] = {
    m.name: m
    for m in (
        LossMode("grpo", "ppo_clip", options=_DUAL, summary="PPO clip with GRPO advantages"),
        LossMode(
            "dapo",
            "ppo_clip",
            eps_high=0.28,
            agg="token-mean",
            dynamic_sampling=True,
            options=_DUAL,
            summary="clip-higher, token-mean, dynamic sampling",
        ),
        LossMode("cispo", "cispo", summary="clipped IS weight, gradient through every token"),
        LossMode(
            "bapo",
            "bapo",
            options=(("target", "bapo_target"),),
            summary="bounds adapted to a positive-update share",
        ),
        LossMode(
            "relax_lower",
            "relax_lower",
            bounds="relaxed",
            options=_DUAL,
            summary="a fixed, lower lower bound (loss.relaxed_lower)",
        ),
        LossMode(
            "calibrated",
            "calibrated",
            bounds="calibrated",
            options=_DUAL,
            summary="Calibrated Clipping: bounds refit from BF16 shadow passes",
        ),
    )
}

BOUND_SOURCES = ("nominal", "relaxed", "calibrated")
