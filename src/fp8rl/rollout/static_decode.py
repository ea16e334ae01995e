"""The decode step over persistent, fixed-shape buffers: the work one CUDA graph captures.

Every tensor the step reads or writes lives in a `DecodeState` allocated once; the step
changes them only in place (the cache slot, the response column, the positions and the
mask's next open slot are device tensors advanced by the step itself), so replaying the
same captured kernels step after step is the decode loop. On the CPU the same step runs
eagerly, which is how the tests check it against the eager engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode import forward_step
from .kv_cache import StaticKVCache
from .masks import additive
from .params import SamplingParams
from .sampling import sample_with_noise


@dataclass
class DecodeState:
    """The persistent buffers of one (batch, capacity, steps) shape; reused across `generate`
    calls."""

    cache: StaticKVCache
    tokens: torch.Tensor  # (B,) the last sampled tokens, the next step's input
    positions: torch.Tensor  # (B, 1) position id of that input
    slot: torch.Tensor  # (1,) cache slot the next step writes
    col: torch.Tensor  # (1,) response column the next record fills
    mask: torch.Tensor  # (B, 1, 1, S) additive, opened one slot per step
    finished: torch.Tensor  # (B,) bool
    pad: torch.Tensor  # (B,) pad id, what finished rows emit
    eos: torch.Tensor  # (E,) stop ids
    noise: torch.Tensor | None  # (B, V) Exp(1) draws of the next record; None when greedy
    response_ids: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) bool
    log_probs: torch.Tensor  # (B, T) float32
    entropy: torch.Tensor  # (B, T) float32
    full_log_probs: torch.Tensor | None = None  # (B, T) float32, with top-p only (sampling.py)

    @classmethod
    def allocate(
        cls,
        batch: int,
        capacity: int,
        steps: int,
        vocab: int,
        *,
        sampling: bool,
        eos_ids,
        truncating: bool = False,
        pad_id: int,
        dtype: torch.dtype,
        device,
        make_cache=StaticKVCache,
    ) -> DecodeState:
        long = dict(dtype=torch.long, device=device)
        return cls(
            cache=make_cache(capacity),
            tokens=torch.zeros(batch, **long),
            positions=torch.zeros(batch, 1, **long),
            slot=torch.zeros(1, **long),
            col=torch.zeros(1, **long),
            mask=torch.zeros(batch, 1, 1, capacity, dtype=dtype, device=device),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
            pad=torch.full((batch,), pad_id, **long),
            eos=torch.tensor(tuple(eos_ids), **long),
            noise=torch.zeros(batch, vocab, device=device) if sampling else None,
            response_ids=torch.zeros(batch, steps, **long),
            response_mask=torch.zeros(batch, steps, dtype=torch.bool, device=device),
            log_probs=torch.zeros(batch, steps, device=device),
            entropy=torch.zeros(batch, steps, device=device),
            full_log_probs=torch.zeros(batch, steps, device=device) if truncating else None,
        )

    def reset(self, prefill: StaticKVCache, prompt_mask: torch.Tensor, n: int) -> None:
        """Start a new batch in the same buffers: row i*n+j gets prompt i's prefilled cache."""
        rows, width = prompt_mask.shape
        for src_store, dst_store in (
            (prefill.keys, self.cache.keys),
            (prefill.values, self.cache.values),
        ):
            for layer, src in src_store.items():
                dst = dst_store.get(layer)
                if dst is None:
                    dst = dst_store[layer] = src.new_empty((rows * n, *src.shape[1:]))
                dst.view(rows, n, *src.shape[1:]).copy_(src[:, None])  # broadcast, no temporary
        valid = prompt_mask.repeat_interleave(n, 0)
        key_valid = torch.zeros(
            self.mask.shape[0], self.mask.shape[-1], dtype=torch.bool, device=valid.device
        )
        key_valid[:, :width] = valid
        self.mask.copy_(additive(key_valid, self.mask.dtype)[:, None, None, :])
        self.positions.copy_(valid.sum(1, keepdim=True))
        self.slot.fill_(width)
        self.col.zero_()
        self.finished.zero_()
        self.response_ids.copy_(self.pad[:, None].expand_as(self.response_ids))
        self.response_mask.zero_()
        self.log_probs.zero_()
        self.entropy.zero_()
        if self.full_log_probs is not None:
            self.full_log_probs.zero_()


def record(state: DecodeState, logits: torch.Tensor, params: SamplingParams) -> None:
    """Sample from `logits` (B, V) and write the token, log-prob and entropy at column `col`.

    Finished rows emit pad with log-prob and entropy 0 and stay masked out; their shapes
    are kept, so a captured graph stays valid however many rows have stopped.
    """
    tok, lp, ent, full = sample_with_noise(logits, params, state.noise, with_full=True)
    finished = state.finished
    alive = ~finished
    tok = torch.where(alive, tok, state.pad)
    state.tokens.copy_(tok)
    state.response_ids.index_copy_(1, state.col, tok[:, None])
    state.response_mask.index_copy_(1, state.col, alive[:, None])
    state.log_probs.index_copy_(1, state.col, lp.masked_fill(finished, 0.0)[:, None])
    state.entropy.index_copy_(1, state.col, ent.masked_fill(finished, 0.0)[:, None])
    if state.full_log_probs is not None:
        state.full_log_probs.index_copy_(1, state.col, full.masked_fill(finished, 0.0)[:, None])
    state.col.add_(1)
    if state.eos.numel():
        finished.logical_or_((tok[:, None] == state.eos).any(-1))


def decode_step(model, state: DecodeState, params: SamplingParams) -> None:
    """Feed back the last tokens, then record the next: the captured unit. No host sync."""
    state.mask.index_fill_(-1, state.slot, 0.0)
    logits = forward_step(
        model, state.tokens[:, None], state.positions, state.mask, state.cache, state.slot
    )
    state.positions.add_(1)
    state.slot.add_(1)
    record(state, logits, params)
