"""Models: tiny random decoders of the supported families, and local Hugging Face checkpoints."""

from .pretrained import load_pretrained
from .tiny import FAMILIES, TINY_DEFAULTS, tiny_model, tiny_qwen3, tiny_qwen3_config

__all__ = [
    "FAMILIES",
    "TINY_DEFAULTS",
    "load_pretrained",
    "tiny_model",
    "tiny_qwen3",
    "tiny_qwen3_config",
]
