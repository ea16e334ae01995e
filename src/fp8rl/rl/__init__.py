"""The RL core: advantages, policy losses, TIS, Calibrated Clipping and FP8 diagnostics.

Pure tensor functions: no models, no FP8 layer. See docs/rl.md.
"""

# oracle registers "oracle_clip", gspo "gspo": every import of an fp8rl.rl module runs this
# file first, so the registry always holds every built-in loss.
from . import gspo, oracle  # noqa: F401
from .advantages import dynamic_sampling_mask, grpo_advantages, overlong_penalty
from .aggregation import AGGREGATIONS, aggregate, aggregation_counts
from .calibration import CalibrationResult, calibrate_bounds
from .calibration_state import CalibrationState
from .clipping import ratio, sequence_ratio
from .diagnostics import (
    clip_decomposition,
    high_entropy_lower_clip_share,
    k3_kl,
    shadow_metrics,
    token_prob_error,
)
from .losses import policy_loss
from .names import BoundSource, CalibrationMode, RatioLevel
from .registry import POLICY_LOSSES, PolicyLossFn, register_policy_loss
from .tis import tis_weights

__all__ = [
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "BoundSource",
    "CalibrationMode",
    "CalibrationResult",
    "CalibrationState",
    "PolicyLossFn",
    "RatioLevel",
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
