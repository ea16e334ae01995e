"""One forward of the decoder over an explicit KV cache: the prefill and every decode step."""

from __future__ import annotations

import functools
import inspect

import torch

from .kv_cache import StaticKVCache
from .masks import model_masks


@functools.cache
def _cache_kwarg(model_type: type) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; either works while both exist
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward_step(
    model,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    mask: torch.Tensor,
    cache: StaticKVCache,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Logits (B, V) of the last input position; writes the inputs' keys/values at `slots`.

    input_ids, position_ids (B, Q); mask (B, 1, Q, cache.max_len) additive; slots (Q,).
    Only tensors in, one tensor out, no data-dependent host branching: capturable.
    """
    cache.slots = slots
    out = model(
        input_ids=input_ids,
        attention_mask=model_masks(mask),
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{_cache_kwarg(type(model)): cache},
    )
    return out.logits[:, -1]
