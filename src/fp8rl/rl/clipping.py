"""The importance ratio and the clip indicators every loss and diagnostic shares (docs/rl.md,
"Notation and the importance ratio"), where a step's ratios leave the bounds
(`clip_decomposition`), and the aggregation of a per-token loss over tokens
and sequences, with the counts that make micro-batch gradient accumulation exact (docs/rl.md,
"Aggregations and gradient accumulation").

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

from fp8rl.utils import masked_mean

from ._shapes import (
    as_bool_mask,
    broadcast_advantages,
    check_same_shape,
    check_tensor,
    require_2d,
    sanitised,
)

# exp(20) ~ 4.9e8: far beyond any clip bound, and finite in float16/bfloat16 too.
LOG_RATIO_CLAMP = 20.0
# GSPO's clamp of the sequence log-ratio, from above only, as verl has it (exp(10) ~ 2.2e4).
SEQ_LOG_RATIO_MAX = 10.0


def ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """r = exp(clamp(logp - logp_old, -20, 20))."""
    return torch.exp((log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def sequence_log_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B,) the mean over each row's masked tokens of logp - logp_old (0 for an empty row),
    unclamped. (B, T) rows."""
    m = as_bool_mask(mask)
    diff = torch.where(m, log_prob - old_log_prob, torch.zeros_like(log_prob))
    return diff.sum(-1) / m.sum(-1).clamp_min(1).to(diff.dtype)


def sequence_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B,) GSPO's sequence ratio s = exp(min(mean_t log r_t, 10)): the length-normalised
    geometric mean of the token ratios."""
    return torch.exp(sequence_log_ratio(log_prob, old_log_prob, mask).clamp(max=SEQ_LOG_RATIO_MAX))


def row_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) one advantage per response: the mean over its masked tokens of (B, T) advantages
    (GRPO's are constant along a row, so this is the row's value; 0 for an empty row)."""
    m = as_bool_mask(mask)
    a = torch.where(m, advantages, torch.zeros_like(advantages))
    return a.sum(-1) / m.sum(-1).clamp_min(1).to(a.dtype)


def lower_clipped(r: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, lower) -> torch.Tensor:
    """Tokens PPO-clip leaves without gradient at the lower bound: A < 0 and r < L."""
    return mask & (adv < 0) & (r < lower)


def upper_clipped(r: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, upper) -> torch.Tensor:
    """Tokens PPO-clip leaves without gradient at the upper bound: A > 0 and r > H."""
    return mask & (adv > 0) & (r > upper)


def clip_decomposition(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    lower,
    upper,
    *,
    prefix: str = "actor/",
) -> dict:
    """Where the ratios leave [L, H], by bound x advantage sign, as fractions of the masked
    tokens. Only lower_neg and upper_pos are clips (no gradient); lower_pos and upper_neg
    are out of bounds on the side PPO-clip lets through. clip_lower_share: the share of
    clipped tokens clipped at the lower bound."""
    check_same_shape("ratio", ratio, mask=mask)
    adv = broadcast_advantages(advantages.detach(), ratio, "ratio")
    m, t = sanitised(mask, r=ratio, adv=adv)
    r, adv = t["r"], t["adv"]
    n_tok = m.sum().to(r.dtype if r.is_floating_point() else torch.float32)
    lower_neg = lower_clipped(r, adv, m, lower).sum()
    upper_pos = upper_clipped(r, adv, m, upper).sum()
    lower_pos = (m & (adv > 0) & (r < lower)).sum()
    upper_neg = (m & (adv < 0) & (r > upper)).sum()
    return {
        f"{prefix}clipfrac_lower_neg": safe_div(lower_neg, n_tok),
        f"{prefix}clipfrac_upper_pos": safe_div(upper_pos, n_tok),
        f"{prefix}clipfrac_lower_pos": safe_div(lower_pos, n_tok),
        f"{prefix}clipfrac_upper_neg": safe_div(upper_neg, n_tok),
        f"{prefix}clipfrac": safe_div(lower_neg + upper_pos, n_tok),
        f"{prefix}clip_lower_share": safe_div(lower_neg, lower_neg + upper_pos),
    }


def clip_metrics(r, adv, m, lower, upper, old, lp) -> dict[str, torch.Tensor]:
    """The metrics every ratio-based loss reports; fractions are over all masked tokens."""
    low = lower_clipped(r, adv, m, lower)
    up = upper_clipped(r, adv, m, upper)
    f = r.dtype
    return {
        "actor/clipfrac_lower_neg": masked_mean(low.to(f), m).detach(),
        "actor/clipfrac_upper_pos": masked_mean(up.to(f), m).detach(),
        "actor/clipfrac": masked_mean((low | up).to(f), m).detach(),
        # k1 estimate of KL(old || new) on the old policy's samples.
        "actor/ppo_kl": masked_mean(old - lp, m).detach(),
        "actor/ratio_mean": masked_mean(r, m).detach(),
    }


def safe_div(
    num: torch.Tensor, den: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """num / den in `dtype` (default: the first floating dtype of num, den, else float32),
    NaN where den == 0 (a fraction of nothing is undefined)."""
    if dtype is None:
        floats = [x.dtype for x in (num, den) if x.is_floating_point()]
        dtype = floats[0] if floats else torch.float32
    num, den = num.to(dtype), den.to(dtype)
    return torch.where(
        den != 0,
        num / torch.where(den != 0, den, torch.ones_like(den)),
        torch.full_like(num, float("nan")),
    )


def masses_at(
    r: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    lowers: torch.Tensor,
    uppers: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """pos(r; H) for every H in `uppers` and neg(r; L) for every L in `lowers`, in
    O(n log n) for any number of candidate bounds (one sort per sign, then searchsorted).
    r, adv, mask: flat or (B, T), same shape; no gradient flows."""
    r, adv, mask = r.detach().reshape(-1), adv.detach().reshape(-1), mask.reshape(-1)
    inf = torch.full_like(r, float("inf"))
    zero = torch.zeros(1, dtype=r.dtype, device=r.device)
    pos_set, neg_set = mask & (adv > 0), mask & (adv < 0)

    # Tokens outside a set get key +inf: sorted last, never <= a finite bound.
    key_p, order_p = torch.sort(torch.where(pos_set, r, inf))
    contrib_p = torch.where(pos_set, adv * r, torch.zeros_like(r))[order_p]
    prefix_p = torch.cat([zero, contrib_p.cumsum(0)])
    pos = prefix_p[torch.searchsorted(key_p, uppers.to(r.dtype), right=True)]

    key_n, order_n = torch.sort(torch.where(neg_set, r, inf))
    contrib_n = torch.where(neg_set, -adv * r, torch.zeros_like(r))[order_n]
    suffix_n = torch.cat([contrib_n.flip(0).cumsum(0).flip(0), zero])
    neg = suffix_n[torch.searchsorted(key_n, lowers.to(r.dtype), right=False)]
    return pos, neg


# ---------------------------------------------------------------- aggregation
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
