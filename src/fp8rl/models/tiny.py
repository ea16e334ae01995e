"""A randomly initialised Qwen3 built from a `transformers` config: no downloads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import Qwen3Config, Qwen3ForCausalLM

# Every linear dim is a multiple of 128 so that tensorwise, rowwise and blockwise
# (128x128 weight blocks) recipes all convert every projection.
TINY_DEFAULTS = dict(
    vocab_size=64,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    # imported here: transformers' model classes take seconds and pull in torchao
    from transformers import Qwen3Config

    unknown = [k for k in overrides if not hasattr(Qwen3Config(), k) and k not in TINY_DEFAULTS]
    if unknown:
        raise ValueError(f"tiny_qwen3: unknown config field(s) {unknown}")
    kw = {**TINY_DEFAULTS, **overrides}
    cfg = Qwen3Config(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def tiny_qwen3(
    *, seed: int | None = 0, dtype: torch.dtype = torch.float32, **overrides
) -> Qwen3ForCausalLM:
    """A tiny Qwen3 (about 0.8M parameters by default) for CPU tests and the demo."""
    from transformers import Qwen3ForCausalLM

    cfg = tiny_qwen3_config(**overrides)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(cfg)
    else:
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype)
