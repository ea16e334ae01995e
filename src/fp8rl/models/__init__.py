"""Models: a tiny Qwen3 from a config, and local Hugging Face checkpoints."""

from .tiny import TINY_DEFAULTS, tiny_qwen3, tiny_qwen3_config

__all__ = ["TINY_DEFAULTS", "tiny_qwen3", "tiny_qwen3_config"]
