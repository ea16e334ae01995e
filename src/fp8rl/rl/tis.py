"""Truncated importance sampling between the rollout engine and the trainer (docs/rl.md, "TIS").

The rollout (FP8, its own kernels) samples from pi_roll, the trainer scores with pi_old;
w = pi_old / pi_roll corrects the mismatch. Weights are detached: they rescale the loss.
Beside the correction, the mismatch's measures (docs/rollout.md): the k3 KL of the two
log-probs (`k3_kl`) and the token probability error (`token_prob_error`).
"""

from __future__ import annotations

import math

import torch

from fp8rl.utils import masked_mean

from ._shapes import as_bool_mask, check_float, check_same_shape, require_2d, sanitised
from .clipping import LOG_RATIO_CLAMP

TIS_LEVELS = ("token", "sequence")
TIS_MODES = ("truncate", "mask")


def tis_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    cap_min: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """Importance weights (same shape as the inputs, detached, 0 on padding) and metrics.

    level="token":    w_i = exp(logp_old_i - logp_roll_i)
    level="sequence": w_b = exp(sum_t m_bt (logp_old_bt - logp_roll_bt)), on every token of b
    mode="truncate":  min(w, cap)                       (cap_min must stay 0)
    mode="mask":      w where cap_min <= w <= cap, else 0
    Log differences are clamped to [-20, 20] before exp (after the sum, for sequences).

    Metrics: actor/tis_weight_mean (final weights), actor/tis_clipfrac (tokens whose
    weight was truncated or masked), actor/tis_raw_weight_mean, actor/tis_raw_weight_max.
    """
    check_same_shape("old_log_prob", old_log_prob, rollout_log_prob=rollout_log_prob, mask=mask)
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level {level!r}; valid: {', '.join(TIS_LEVELS)}")
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; valid: {', '.join(TIS_MODES)}")
    cap = check_float("cap", cap, low=0.0, high=math.inf, low_open=True, high_open=True)
    cap_min = check_float("cap_min", cap_min, low=0.0, high=cap, high_open=True)
    if mode == "truncate" and cap_min != 0.0:
        raise ValueError(
            f"cap_min = {cap_min!r} only applies to mode='mask'; truncate is min(w, cap)"
        )

    m = as_bool_mask(mask)
    old = old_log_prob.detach()
    diff = torch.where(m, old - rollout_log_prob.detach().to(old.dtype), torch.zeros_like(old))
    if level == "sequence":
        require_2d("old_log_prob", old_log_prob, "level='sequence'")
        diff = diff.sum(-1, keepdim=True).expand_as(diff)
    raw = torch.exp(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))

    if mode == "truncate":
        out_of_range = raw > cap
        w = raw.clamp(max=cap)
    else:
        out_of_range = (raw > cap) | (raw < cap_min)
        w = torch.where(out_of_range, torch.zeros_like(raw), raw)
    zero = torch.zeros_like(w)
    w = torch.where(m, w, zero)
    f = w.dtype
    metrics = {
        "actor/tis_weight_mean": masked_mean(w, m),
        "actor/tis_clipfrac": masked_mean((out_of_range & m).to(f), m),
        "actor/tis_raw_weight_mean": masked_mean(raw, m),
        # raw > 0, so 0 at padding never wins the max; an empty mask gives 0.
        "actor/tis_raw_weight_max": torch.where(m, raw, zero).amax() if raw.numel() else zero.sum(),
    }
    return w, metrics


def k3_kl(log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(p || q) from tokens sampled from p: mean of (q/p - 1) - log(q/p).
    For mismatch/kl_rollout_train pass log_p = rollout log-probs, log_q = trainer ones.
    Non-negative per token, unbiased, low variance."""
    check_same_shape("log_p", log_p, log_q=log_q, mask=mask)
    m, t = sanitised(mask, lp=log_p, lq=log_q.to(log_p.dtype))
    d = (t["lq"] - t["lp"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return masked_mean(torch.expm1(d) - d, m)


def token_prob_error(log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level multiplicative probability error: mean of exp(|log p - log q|) over the
    masked tokens (NeMo-RL's token_mult_prob_error; 1 when the two agree). For
    mismatch/token_prob_error pass the rollout's and the trainer's log-probs."""
    check_same_shape("log_p", log_p, log_q=log_q, mask=mask)
    m, t = sanitised(mask, lp=log_p, lq=log_q.to(log_p.dtype))
    d = (t["lq"] - t["lp"]).abs().clamp(max=LOG_RATIO_CLAMP)
    return masked_mean(d.exp(), m)
