"""Rollout: batched generation in high precision or FP8 (W8A8), and the trainer's log-probs.

See docs/rollout.md.
"""

from .batch import RolloutBatch
from .decode import forward_step
from .engine import RolloutEngine
from .graph_decode import StaticDecoder
from .kv_cache import StaticKVCache
from .logprobs import compute_log_probs
from .params import SamplingParams
from .sampling import sample_next, token_log_probs

__all__ = [
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "StaticDecoder",
    "StaticKVCache",
    "compute_log_probs",
    "forward_step",
    "sample_next",
    "token_log_probs",
]
