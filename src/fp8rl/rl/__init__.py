"""The RL core: advantages, policy losses, TIS, Calibrated Clipping and FP8 diagnostics.

Pure tensor functions: no models, no FP8 layer. See docs/rl.md.
"""

from .calibration import CalibrationResult, calibrate_bounds
from .calibration_state import CalibrationState
from .clipping import (
    AGGREGATIONS,
    aggregate,
    aggregation_counts,
    clip_decomposition,
    ratio,
    sequence_ratio,
)
from .loss_modes import BoundSource, CalibrationMode, RatioLevel
from .losses import (
    POLICY_LOSSES,
    PolicyLossFn,
    dynamic_sampling_mask,
    grpo_advantages,
    overlong_penalty,
    policy_loss,
    register_policy_loss,
)
from .shadow import ShadowRows, high_entropy_lower_clip_share, shadow_metrics
from .tis import k3_kl, tis_weights, token_prob_error

__all__ = [
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "BoundSource",
    "CalibrationMode",
    "CalibrationResult",
    "CalibrationState",
    "PolicyLossFn",
    "RatioLevel",
    "ShadowRows",
    "aggregate",
    "aggregation_counts",
    "calibrate_bounds",
    "clip_decomposition",
    "dynamic_sampling_mask",
    "grpo_advantages",
    "high_entropy_lower_clip_share",
    "k3_kl",
    "overlong_penalty",
    "policy_loss",
    "ratio",
    "register_policy_loss",
    "sequence_ratio",
    "shadow_metrics",
    "tis_weights",
    "token_prob_error",
]
