"""The trainer's log-probs of response tokens: one forward over prompt + response."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .masks import (
    additive,
    causal_allowed,
    check_model_supported,
    check_window,
    model_masks,
    position_ids,
)
from .sampling import token_log_probs

_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def _field(batch, name: str) -> torch.Tensor:
    value = batch.get(name) if isinstance(batch, Mapping) else getattr(batch, name, None)
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"compute_log_probs: batch.{name} is missing or not a tensor "
            f"(got {type(value).__name__})"
        )
    return value


def compute_log_probs(
    model,
    batch,
    *,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    with_entropy: bool = False,
):
    """Per-token log-probs (B, T) float32 of `batch.response_ids` under
    softmax(logits / temperature).

    `batch` is a `RolloutBatch` or anything with prompt_ids/prompt_mask (left padded) and
    response_ids/response_mask (right padded), as attributes or keys. Runs in whatever
    precision the model is in now (it never switches recipes) and keeps the autograd graph
    when grad is enabled. Only the T response positions go through log-softmax, in float32.
    Returns (log_probs, entropy or None); both are 0 where response_mask is False.
    """
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(
            f"compute_log_probs: temperature = {temperature!r} must be a finite number > 0"
        )
    if micro_batch_size is not None and (
        isinstance(micro_batch_size, bool)
        or not isinstance(micro_batch_size, int)
        or micro_batch_size < 1
    ):
        raise ValueError(
            f"compute_log_probs: micro_batch_size = {micro_batch_size!r} "
            "must be None or an int >= 1"
        )
    check_model_supported(model)
    device = model.get_input_embeddings().weight.device
    prompt_ids, prompt_mask, response_ids, response_mask = (
        _field(batch, n).to(device) for n in _FIELDS
    )
    b, t = response_ids.shape
    if (
        prompt_ids.shape[0] != b
        or prompt_mask.shape != prompt_ids.shape
        or response_mask.shape != response_ids.shape
    ):
        raise ValueError(
            f"compute_log_probs: inconsistent shapes prompt_ids {tuple(prompt_ids.shape)}, "
            f"prompt_mask {tuple(prompt_mask.shape)}, response_ids {tuple(response_ids.shape)}, "
            f"response_mask {tuple(response_mask.shape)}"
        )
    check_window(model.config, prompt_ids.shape[1] + t)
    dtype = model.get_input_embeddings().weight.dtype
    step = micro_batch_size or max(b, 1)
    log_probs, entropies = [], []
    for s in range(0, b, step):
        rows = slice(s, s + step)
        ids = torch.cat([prompt_ids[rows], response_ids[rows]], 1)
        valid = torch.cat([prompt_mask[rows].bool(), response_mask[rows].bool()], 1)
        out = model(
            input_ids=ids,
            attention_mask=model_masks(additive(causal_allowed(valid), dtype)),
            position_ids=position_ids(valid),
            use_cache=False,
            logits_to_keep=t + 1,
        )
        # logits at position j predict token j + 1: the last t + 1 positions minus the final one
        lp, ent = token_log_probs(
            out.logits[:, :-1], response_ids[rows], temperature, with_entropy=with_entropy
        )
        keep = response_mask[rows].bool()
        log_probs.append(lp.masked_fill(~keep, 0.0))
        if with_entropy:
            entropies.append(ent.masked_fill(~keep, 0.0))
    if b == 0:
        empty = torch.zeros(0, t, dtype=torch.float32, device=device)
        return empty, (empty.clone() if with_entropy else None)
    return torch.cat(log_probs, 0), (torch.cat(entropies, 0) if with_entropy else None)
