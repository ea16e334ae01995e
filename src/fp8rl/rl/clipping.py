"""The importance ratio and the clip indicators every loss and diagnostic shares
(docs/rl.md, "Notation and the importance ratio")."""

from __future__ import annotations

import torch

from fp8rl.utils import masked_mean

from ._shapes import as_bool_mask

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
