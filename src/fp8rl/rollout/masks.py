"""Attention masks and position ids for left-padded rows, shared by decoding and the trainer
forward.

The model receives one ready 4D additive float mask (B, 1, Q, K), 0 where attended and the
dtype's min where not, which every `transformers` decoder family takes as is (a dict of masks
per attention type is read by Qwen2/Qwen3 only: Llama, Mistral, Phi-3, Gemma and Qwen3-MoE
fail on it), so decoding never rebuilds masks from 2D padding masks.
A padded query attends to itself only, so its hidden states (which no real token reads)
depend on its own token alone, the same in the rollout's cache and in the trainer's
forward: pad rows enter batch-wide statistics such as a tensorwise FP8 amax identically.
"""

from __future__ import annotations

import torch

SUPPORTED_ATTENTION = ("sdpa", "eager")
# Families whose sliding-window layers are part of the architecture (short windows, softcapped
# or local-global attention): fp8rl's full causal mask would compute another model
SLIDING_FAMILIES = ("gemma2", "gemma3", "gemma3_text")


def attention_window(config) -> int | None:
    """The sliding window some layers of the model attend within, None when all attend fully.

    Mistral and Phi-3 give one `sliding_window` for every layer; Qwen2/Qwen3 list their
    window layers in `layer_types` (`use_sliding_window`, `max_window_layers`).
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return window


def check_model_supported(model) -> None:
    """Raise a clear error for models whose attention this module cannot feed."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type in SLIDING_FAMILIES:
        raise ValueError(
            f"rollout: model_type {model_type!r} is unsupported: its sliding-window layers "
            "are part of the architecture and fp8rl attends over the whole sequence"
        )
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not layer_types <= {"full_attention", "sliding_attention"}:
        raise ValueError(
            f"rollout: model.config.layer_types = {sorted(layer_types)} is unsupported: "
            "only full attention (and sliding windows no shorter than the sequence) is"
        )
    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"rollout: model.config._attn_implementation = {impl!r} is unsupported: "
            f"expected one of {SUPPORTED_ATTENTION} (they take additive 4D masks)"
        )


def check_window(config, length: int) -> None:
    """A sliding window shorter than the sequence would make the model's attention differ from
    the full causal mask fp8rl gives it: refused, naming the config field."""
    window = attention_window(config)
    if window is not None and length > window:
        raise ValueError(
            f"rollout: model.config.sliding_window = {window} is shorter than the sequence "
            f"({length} tokens: prompt + response); fp8rl attends over the whole sequence"
        )


def position_ids(valid: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting only valid tokens, so a left-padded row starts at 0; pads get 0."""
    return (valid.long().cumsum(1) - 1).clamp_min(0)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool 'may attend' to the additive form (0 or the dtype's min) that eager and sdpa both
    take."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def causal_allowed(valid: torch.Tensor, key_len: int | None = None) -> torch.Tensor:
    """(B, 1, L, S) bool: query i may attend key j <= i when j is valid; always itself.

    `valid` (B, L) marks real tokens; keys beyond L (up to `key_len`, e.g. empty cache
    slots) are not attended.
    """
    b, length = valid.shape
    key_len = length if key_len is None else key_len
    q = torch.arange(length, device=valid.device)[:, None]
    k = torch.arange(key_len, device=valid.device)[None, :]
    key_valid = torch.zeros(b, key_len, dtype=torch.bool, device=valid.device)
    key_valid[:, :length] = valid
    allowed = (k <= q)[None] & key_valid[:, None, :]
    allowed |= (k == q)[None]
    return allowed[:, None]


def model_masks(mask: torch.Tensor) -> torch.Tensor:
    """What a `transformers` decoder takes in place of a 2D attention mask: the additive
    (B, 1, Q, K) mask itself, which its mask preparation passes through untouched."""
    if mask.dim() != 4 or not mask.is_floating_point():
        raise ValueError(
            f"model_masks: expected a 4D additive float mask, got shape {tuple(mask.shape)} "
            f"and dtype {mask.dtype}"
        )
    return mask
