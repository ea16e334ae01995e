"""fp8rl's Calibrated Clipping as a verl policy loss
(`actor.policy_loss.loss_mode=fp8rl_calibrated`).

verl picks policy losses by name from `verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY`;
`register()` (run on import when verl is importable) adds `fp8rl_calibrated` with verl's
keyword signature. The clip bounds come from the process's `CalibrationState`
(`calibration_state()`), which `calibrate_from_reference` feeds from BF16 shadow log-probs
at its shadow steps. The surrogate itself is verl's own `vanilla` loss with its clip
range replaced by (1 - L, H - 1), so aggregation, dual-clip and rollout IS weights keep
verl's exact semantics; fp8rl's clip-decomposition metrics are added.
This module imports without verl; only register() and the loss need it. The actor worker
(`fp8rl.integrations.verl_worker`) imports this module, never the reverse.
"""

from __future__ import annotations

import copy
import dataclasses

from ..rl.calibration import CalibrationResult
from ..rl.calibration_state import CalibrationState
from ..rl.clipping import clip_decomposition, ratio

LOSS_NAME = "fp8rl_calibrated"
_STATE: CalibrationState | None = None


def verl_available() -> bool:
    try:
        from verl.trainer.ppo import core_algos  # noqa: F401
    except ImportError:
        return False
    return True


def set_calibration_state(state: CalibrationState) -> None:
    if not isinstance(state, CalibrationState):
        raise TypeError(
            f"set_calibration_state: expected a CalibrationState, got {type(state).__name__}"
        )
    global _STATE
    _STATE = state


def calibration_state(config=None) -> CalibrationState:
    """This process's state; created on first use from the config's nominal clip range."""
    global _STATE
    if _STATE is None:
        low, high = _clip_range(config) if config is not None else (0.2, 0.2)
        _STATE = CalibrationState(lower=1 - low, upper=1 + high, nominal=(1 - low, 1 + high))
    return _STATE


def _get(config, name, default=None):
    return config.get(name, default) if hasattr(config, "get") else getattr(config, name, default)


def _clip_range(config) -> tuple[float, float]:
    eps = _get(config, "clip_ratio", 0.2)
    low, high = _get(config, "clip_ratio_low"), _get(config, "clip_ratio_high")
    return (eps if low is None else low), (eps if high is None else high)


def _with_clip_range(config, low: float, high: float):
    if dataclasses.is_dataclass(config):
        try:
            return dataclasses.replace(config, clip_ratio_low=low, clip_ratio_high=high)
        except (TypeError, ValueError):  # a dataclass whose __init__ rejects re-validation
            out = copy.copy(config)
            object.__setattr__(out, "clip_ratio_low", low)
            object.__setattr__(out, "clip_ratio_high", high)
            return out
    out = copy.deepcopy(config)
    out["clip_ratio_low"], out["clip_ratio_high"] = low, high
    return out


def calibrated_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    config=None,
    rollout_is_weights=None,
):
    """verl's policy-loss signature: returns (loss, metrics) with the calibrated bounds."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    if config is None:
        raise ValueError(f"{LOSS_NAME}: verl passes the actor config; got config=None")
    state = calibration_state(config)
    lower, upper = state.bounds
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=_with_clip_range(config, 1 - lower, upper - 1),
        rollout_is_weights=rollout_is_weights,
    )
    r = ratio(log_prob.detach(), old_log_prob.detach())
    extra = clip_decomposition(r, advantages, response_mask, lower, upper, prefix="fp8rl/")
    metrics = dict(metrics)
    metrics.update({k: float(v) for k, v in extra.items()})
    metrics.update({"calib/lower": lower, "calib/upper": upper})
    return loss, metrics


def calibrate_from_reference(
    step: int,
    old_log_prob,
    log_prob,
    ref_old_log_prob,
    ref_log_prob,
    advantages,
    response_mask,
    state: CalibrationState | None = None,
) -> CalibrationResult | None:
    """Feed a shadow step's FP8 log-probs and their BF16 shadows (same weights, quantization
    off) to the state: ratio = exp(log_prob - old), its shadow exp(ref_log_prob - ref_old)
    (these parameters keep the names verl's callers pass; here `ref` is the BF16 shadow).
    Returns the CalibrationResult at the state's refit steps, else None (also when `step` is
    no shadow step). Pass the tensors of the whole global batch (all data-parallel ranks), so
    every worker computes the same bounds."""
    state = state or calibration_state()
    if not state.is_shadow_step(step):
        return None
    r = ratio(log_prob.detach(), old_log_prob.detach())
    r_shadow = ratio(ref_log_prob.detach(), ref_old_log_prob.detach())
    return state.observe(step, r, r_shadow, advantages, response_mask)


def register() -> bool:
    """Add `fp8rl_calibrated` to verl's registry (idempotent); False when verl isn't importable."""
    if not verl_available():
        return False
    from verl.trainer.ppo import core_algos

    if core_algos.POLICY_LOSS_REGISTRY.get(LOSS_NAME) is not calibrated_policy_loss:
        core_algos.register_policy_loss(LOSS_NAME)(calibrated_policy_loss)
    return True


register()
