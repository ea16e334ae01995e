"""Loss aggregation over tokens and sequences, and the counts that make micro-batch gradient
accumulation exact (docs/rl.md, "Aggregations and gradient accumulation").

Gradient accumulation: compute the counts once over the whole mini-batch mask,
pass them to every micro-batch, and sum (not average) the micro-batch losses:

    counts = aggregation_counts(minibatch_mask)
    for mb in micro_batches:
        loss, _ = policy_loss(..., agg=agg, **counts)   # a sum contribution
        loss.backward()                                 # grads add up to the full loss's
    optimizer.step()

Every aggregation is then a sum of per-token terms over a constant normalizer, so the
micro-batch losses add up to the full mini-batch loss exactly (rows must not be split).
"""

from __future__ import annotations

import torch

from ._shapes import as_bool_mask, check_tensor, require_2d

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def aggregation_counts(mask: torch.Tensor) -> dict:
    """The normalizers of a whole mini-batch, to pass to each of its micro-batches:
    global_token_count (masked tokens), global_seq_count (rows with at least one token),
    norm_len (T, the Dr. GRPO length). Tensors stay on the device: no sync."""
    check_tensor("mask", mask)
    m = as_bool_mask(mask)
    out = {"global_token_count": m.sum()}
    if m.dim() == 2:
        out["global_seq_count"] = m.any(dim=-1).sum()
        out["norm_len"] = m.shape[-1]
    return out


def _positive_count(name: str, value):
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number or a tensor, got {value!r}")
    return value


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    *,
    norm_len: int | None = None,
    global_token_count=None,
    global_seq_count=None,
) -> torch.Tensor:
    """Reduce per-token losses (B, T) (or flat (n,) for token-mean) to a scalar.

    token-mean               sum_i l_i / n_tokens                      (DAPO)
    seq-mean-token-mean      sum_b (sum_t l_bt / n_b) / n_seqs         (GRPO)
    seq-mean-token-sum       sum_b (sum_t l_bt) / n_seqs
    seq-mean-token-sum-norm  sum_bt l_bt / (n_seqs * norm_len)         (Dr. GRPO, norm_len=T)

    n_seqs counts rows with at least one token. global_token_count / global_seq_count
    replace n_tokens / n_seqs (see the module docstring: micro-batches). An empty
    selection gives 0, not NaN.
    """
    check_tensor("loss_mat", loss_mat)
    check_tensor("mask", mask)
    if mask.shape != loss_mat.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(loss_mat.shape)}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGGREGATIONS)}")
    global_token_count = _positive_count("global_token_count", global_token_count)
    global_seq_count = _positive_count("global_seq_count", global_seq_count)
    m = as_bool_mask(mask)
    # where, not multiply: a NaN at a padded position must not leak into the sum.
    masked = torch.where(m, loss_mat, torch.zeros_like(loss_mat))

    if agg == "token-mean":
        den = m.sum() if global_token_count is None else global_token_count
        return masked.sum() / _clamp_den(den, loss_mat)

    require_2d("loss_mat", loss_mat, f"agg={agg!r}")
    n_seqs = m.any(dim=-1).sum() if global_seq_count is None else global_seq_count
    n_seqs = _clamp_den(n_seqs, loss_mat)
    if agg == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / m.sum(-1).clamp_min(1).to(loss_mat.dtype)
        return per_seq.sum() / n_seqs
    if agg == "seq-mean-token-sum":
        return masked.sum() / n_seqs
    if norm_len is None:
        norm_len = loss_mat.shape[-1]
    if isinstance(norm_len, bool) or not isinstance(norm_len, int) or norm_len < 1:
        raise ValueError(f"norm_len must be a positive int, got {norm_len!r}")
    return masked.sum() / (n_seqs * norm_len)


def _clamp_den(den, like: torch.Tensor):
    # Counts: an empty selection divides 0 by 1. Python numbers were checked positive.
    if isinstance(den, torch.Tensor):
        return den.to(like.dtype).clamp_min(1)
    return float(den)
