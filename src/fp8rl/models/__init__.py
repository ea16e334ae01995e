"""Models: a tiny Qwen3 from a config, and local Hugging Face checkpoints."""

from .pretrained import load_pretrained
from .tiny import TINY_DEFAULTS, tiny_qwen3, tiny_qwen3_config

__all__ = ["TINY_DEFAULTS", "load_pretrained", "tiny_qwen3", "tiny_qwen3_config"]
