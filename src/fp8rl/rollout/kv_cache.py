"""An explicit, preallocated KV cache that a `transformers` decoder writes through `update`."""

from __future__ import annotations

import torch


class StaticKVCache:
    """Keys and values of every layer in fixed buffers (B, H_kv, max_len, D).

    The caller says where the next forward's tokens go (`slots`, a (Q,) int64 tensor of
    cache positions, shared by all rows) before each forward; attention layers call
    `update`, which writes there in place and returns the whole buffers. Fixed shapes and
    in-place writes at a tensor index are what a captured CUDA graph of the decode step
    needs. It implements only the part of the `transformers` Cache interface the decoder
    layers use when the caller passes position ids and ready masks.
    """

    def __init__(self, max_len: int):
        if max_len < 1:
            raise ValueError(f"StaticKVCache: max_len = {max_len} must be >= 1")
        self.max_len = max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.slots: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ):
        if self.slots is None:
            raise RuntimeError("StaticKVCache.update: set cache.slots before the forward")
        if layer_idx not in self.keys:
            b, h, _, _ = key_states.shape
            self.keys[layer_idx] = key_states.new_zeros(b, h, self.max_len, key_states.shape[-1])
            self.values[layer_idx] = value_states.new_zeros(
                b, h, self.max_len, value_states.shape[-1]
            )
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.slots, key_states)
        values.index_copy_(2, self.slots, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.slots is None else int(self.slots.max()) + 1

    def repeat_rows(self, n: int) -> None:
        """Row i becomes rows i*n .. i*n+n-1: prefill a prompt once, decode its n samples."""
        if n == 1:
            return
        for store in (self.keys, self.values):
            for i, t in store.items():
                store[i] = t.repeat_interleave(n, dim=0)
