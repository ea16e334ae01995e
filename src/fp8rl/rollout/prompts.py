"""Prompts in (strings or token ids), left-padded id tensors out; responses back to text."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def encode_prompts(prompts, tokenizer, vocab_size: int) -> list[list[int]]:
    """Token-id lists from a list of strings (needs `tokenizer`) or of token-id sequences."""
    if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"generate: prompts must be a list of strings or of token-id lists, "
            f"got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("generate: prompts is empty")
    if all(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise ValueError(
                "generate: prompts are strings but the engine has no tokenizer "
                "(pass one to RolloutEngine, or pass token ids)"
            )
        ids = _tokenize(tokenizer, list(prompts))
    elif any(isinstance(p, str) for p in prompts):
        raise TypeError("generate: prompts mix strings and token ids")
    else:
        ids = [_as_id_list(p, i) for i, p in enumerate(prompts)]
    for i, row in enumerate(ids):
        if len(row) == 0:
            raise ValueError(f"generate: prompts[{i}] is empty (after tokenization)")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"generate: prompts[{i}] has token ids {bad[:5]} outside [0, {vocab_size})"
            )
    return ids


def _as_id_list(p, i: int) -> list[int]:
    if isinstance(p, torch.Tensor):
        if p.dim() != 1 or p.dtype.is_floating_point or p.dtype == torch.bool:
            raise TypeError(
                f"generate: prompts[{i}] is a tensor of shape {tuple(p.shape)} and "
                f"dtype {p.dtype}: expected a 1-D integer tensor"
            )
        return p.tolist()
    if not isinstance(p, Sequence) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in p
    ):
        raise TypeError(f"generate: prompts[{i}] = {p!r:.80} is not a string or a sequence of ints")
    return list(p)


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    # a `transformers` tokenizer is callable and returns a mapping; anything with `encode` works too
    if callable(tokenizer):
        out = tokenizer(texts)
        ids = out["input_ids"] if not isinstance(out, list) else out
        return [list(map(int, row)) for row in ids]
    return [list(map(int, tokenizer.encode(t))) for t in texts]


def left_pad(ids: list[list[int]], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) int64 ids and bool mask, padded on the left."""
    width = max(len(r) for r in ids)
    out = torch.full((len(ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.bool)
    for i, row in enumerate(ids):
        out[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = True
    return out.to(device), mask.to(device)


def decode_responses(tokenizer, response_ids: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    """The generated tokens of each row as text, special tokens kept: a reward sees the EOS
    that ended a response (and any special token sampled before it), exactly as generated."""
    rows = [r[:n] for r, n in zip(response_ids.tolist(), lengths.tolist(), strict=True)]
    if hasattr(tokenizer, "batch_decode"):
        return list(tokenizer.batch_decode(rows, skip_special_tokens=False))
    return [tokenizer.decode(r) for r in rows]
