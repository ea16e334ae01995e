"""Diagnostics of FP8 ratio noise (docs/rl.md, "Diagnostics"): BF16 shadow metrics (of token
ratios, and of GSPO's sequence ratios), the clip decomposition, the high-entropy attribution of
lower clips, the rollout/trainer k3 KL.

Every tensor helper takes (B, T) rows or flat (n,) masked token vectors, so the statistics
of several mini-batches pool by concatenation. Results are detached 0-d tensors (no
host sync); a fraction of an empty set is NaN.
"""

from __future__ import annotations

import math

import torch

from fp8rl.utils import masked_mean

from ._shapes import (
    as_bool_mask,
    broadcast_advantages,
    check_bounds,
    check_float,
    check_same_shape,
    require_2d,
)
from .clipping import (
    LOG_RATIO_CLAMP,
    SEQ_LOG_RATIO_MAX,
    lower_clipped,
    ratio,
    row_advantages,
    safe_div,
    sequence_log_ratio,
    upper_clipped,
)

# -log 0.8: a log-ratio error this large moves a ratio of 1 across the nominal lower bound alone
LOG_RATIO_TAIL = 0.223


def _sanitised(mask, **tensors):
    """Bool mask and each tensor detached with padded positions set to 0."""
    m = as_bool_mask(mask)
    out = {}
    for name, x in tensors.items():
        x = x.detach()
        out[name] = torch.where(m, x, torch.zeros_like(x))
    return m, out


def shadow_metrics(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob_shadow: torch.Tensor,
    old_log_prob_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bounds: tuple[float, float],
    nominal: tuple[float, float],
) -> dict:
    """FP8 vs BF16-shadow statistics of one step (docs/rl.md, "Diagnostics": the names too).

    log_prob / old_log_prob: FP8 trainer log-probs (current, old policy);
    *_ref: the BF16 shadow passes of the same weights. `bounds` are the (L, H) in use,
    `nominal` the (l0, h0) the BF16 reference is clipped with.
    """
    check_same_shape(
        "log_prob",
        log_prob,
        old_log_prob=old_log_prob,
        log_prob_shadow=log_prob_shadow,
        old_log_prob_shadow=old_log_prob_shadow,
        mask=mask,
    )
    lower, upper = check_bounds("bounds", bounds)
    l0, h0 = check_bounds("nominal", nominal)
    adv = broadcast_advantages(advantages.detach(), log_prob, "log_prob")
    m, t = _sanitised(
        mask,
        lp=log_prob,
        old=old_log_prob,
        lp_shadow=log_prob_shadow,
        old_shadow=old_log_prob_shadow.to(log_prob.dtype),
        adv=adv,
    )
    lp, old, lp_shadow, old_shadow = t["lp"], t["old"], t["lp_shadow"], t["old_shadow"]
    r, r_shadow = ratio(lp, old), ratio(lp_shadow, old_shadow)
    n_tok = m.sum().to(lp.dtype)  # counts become fractions in the inputs' precision
    return {
        **_noise_stats(lp, lp_shadow, r, r_shadow, m),
        **_clip_stats(r, r_shadow, t["adv"], m, (lower, upper), (l0, h0), n_tok),
        **_deviation_stats(lp - old, lp_shadow - old_shadow, r, r_shadow, m, n_tok),
    }


def _masked_sum(m, x):
    return torch.where(m, x, torch.zeros_like(x)).sum()


def _noise_stats(lp, lp_shadow, r, r_shadow, m) -> dict:
    """Per-token probability and ratio errors and their quotient (the amplification)."""
    p, p_shadow = torch.exp(lp), torch.exp(lp_shadow)
    nmae_prob = safe_div(_masked_sum(m, (p - p_shadow).abs()), _masked_sum(m, p_shadow.abs()))
    nmae_ratio = safe_div(_masked_sum(m, (r - r_shadow).abs()), _masked_sum(m, r_shadow.abs()))
    # Unweighted relative errors: the NMAE quotient weights tokens by p in its denominator and
    # not in its numerator, which mixes that weighting with the propagation it should measure.
    rel_ratio = _masked_sum(m, (r / torch.where(m, r_shadow, torch.ones_like(r_shadow)) - 1).abs())
    rel_prob = _masked_sum(m, (p / torch.where(m, p_shadow, torch.ones_like(p_shadow)) - 1).abs())
    return {
        "shadow/nmae_prob": nmae_prob,
        "shadow/nmae_ratio": nmae_ratio,
        "shadow/amplification": safe_div(rel_ratio, rel_prob),
        "shadow/nmae_quotient": safe_div(nmae_ratio, nmae_prob),
    }


def _clip_stats(r, r_shadow, adv, m, bounds, nominal, n_tok) -> dict:
    """FP8's clips at the bounds in use against the shadow's at the nominal ones."""
    low_fp8, up_fp8 = lower_clipped(r, adv, m, bounds[0]), upper_clipped(r, adv, m, bounds[1])
    low_bf16 = lower_clipped(r_shadow, adv, m, nominal[0])
    up_bf16 = upper_clipped(r_shadow, adv, m, nominal[1])
    n_neg = (m & (adv < 0)).sum().to(n_tok.dtype)
    clipfrac_fp8 = safe_div((low_fp8 | up_fp8).sum(), n_tok)
    clipfrac_bf16 = safe_div((low_bf16 | up_bf16).sum(), n_tok)
    return {
        "shadow/clipfrac_fp8": clipfrac_fp8,
        "shadow/clipfrac_bf16": clipfrac_bf16,
        "shadow/clipfrac_ratio": safe_div(clipfrac_fp8, clipfrac_bf16),
        # the lower clips as a fraction of all tokens, comparable with clipfrac_*: which share
        # of FP8's extra clips sits at the lower bound on negative tokens (a paper signature)
        "shadow/clipfrac_lower_neg_fp8": safe_div(low_fp8.sum(), n_tok),
        "shadow/clipfrac_lower_neg_bf16": safe_div(low_bf16.sum(), n_tok),
        "shadow/lower_clipfrac_neg_fp8": safe_div(low_fp8.sum(), n_neg),
        "shadow/lower_clipfrac_neg_bf16": safe_div(low_bf16.sum(), n_neg),
        "shadow/lower_clip_excess": safe_div(low_fp8.sum() - low_bf16.sum(), n_neg),
        "shadow/false_lower_clip": safe_div((low_fp8 & ~low_bf16).sum(), n_neg),
    }


def _deviation_stats(log_r, log_r_shadow, r, r_shadow, m, n_tok) -> dict:
    """How far ratios stray from 1, and the log-ratio error e = log r - log rhat per token:
    its sd and its tail beyond -log 0.8."""
    c = LOG_RATIO_CLAMP
    e = torch.where(m, log_r.clamp(-c, c) - log_r_shadow.clamp(-c, c), torch.zeros_like(log_r))
    e_var = safe_div(_masked_sum(m, (e - safe_div(e.sum(), n_tok)) ** 2), n_tok - 1)
    return {
        # Mean |r - 1|: FP8 noise inflates the first.
        "shadow/ratio_dev_fp8": safe_div(_masked_sum(m, (r - 1).abs()), n_tok),
        "shadow/ratio_dev_bf16": safe_div(_masked_sum(m, (r_shadow - 1).abs()), n_tok),
        "shadow/logratio_err_sd": torch.sqrt(e_var),
        "shadow/logratio_err_tail": safe_div((m & (e.abs() > LOG_RATIO_TAIL)).sum(), n_tok),
    }


def sequence_shadow_metrics(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob_shadow: torch.Tensor,
    old_log_prob_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bounds: tuple[float, float],
    nominal: tuple[float, float],
) -> dict:
    """FP8 vs BF16-shadow statistics of GSPO's sequence ratios, one per response with a token
    (docs/rl.md, "Diagnostics"): the lower clips of the negative-advantage responses, FP8's
    s at the lower bound in use and the shadow's shat at the nominal one, and the sequence
    log-ratio error e = log s - log shat (both clamped at 10, as the loss clamps them): its sd,
    and the share of responses with |e| > -log l0 (an error that alone moves a ratio of 1
    across the nominal lower bound). (B, T) rows; a response's advantage is its tokens' mean."""
    check_same_shape(
        "log_prob",
        log_prob,
        old_log_prob=old_log_prob,
        log_prob_shadow=log_prob_shadow,
        old_log_prob_shadow=old_log_prob_shadow,
        mask=mask,
    )
    require_2d("log_prob", log_prob, "sequence_shadow_metrics (responses are rows)")
    lower, _ = check_bounds("bounds", bounds)
    l0, _ = check_bounds("nominal", nominal)
    adv = broadcast_advantages(advantages.detach(), log_prob, "log_prob")
    m, t = _sanitised(
        mask,
        lp=log_prob,
        old=old_log_prob,
        lp_shadow=log_prob_shadow,
        old_shadow=old_log_prob_shadow.to(log_prob.dtype),
        adv=adv,
    )
    rows, a = m.any(-1), row_advantages(t["adv"], m)
    log_s = sequence_log_ratio(t["lp"], t["old"], m).clamp(max=SEQ_LOG_RATIO_MAX)
    log_s_shadow = sequence_log_ratio(t["lp_shadow"], t["old_shadow"], m).clamp(
        max=SEQ_LOG_RATIO_MAX
    )
    low_fp8 = lower_clipped(torch.exp(log_s), a, rows, lower)
    low_bf16 = lower_clipped(torch.exp(log_s_shadow), a, rows, l0)
    n_seq, n_neg = rows.sum().to(log_s.dtype), (rows & (a < 0)).sum().to(log_s.dtype)
    zero = torch.zeros_like(log_s)
    e = torch.where(rows, log_s - log_s_shadow, zero)
    e_var = safe_div(torch.where(rows, (e - safe_div(e.sum(), n_seq)) ** 2, zero).sum(), n_seq - 1)
    return {
        "shadow/seq_lower_clipfrac_neg_fp8": safe_div(low_fp8.sum(), n_neg),
        "shadow/seq_lower_clipfrac_neg_bf16": safe_div(low_bf16.sum(), n_neg),
        "shadow/seq_lower_clip_excess": safe_div(low_fp8.sum() - low_bf16.sum(), n_neg),
        "shadow/seq_logratio_err_sd": torch.sqrt(e_var),
        "shadow/seq_logratio_err_tail": safe_div((rows & (e.abs() > -math.log(l0))).sum(), n_seq),
    }


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
    m, t = _sanitised(mask, r=ratio, adv=adv)
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


def high_entropy_lower_clip_share(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    lower,
    top_fraction: float = 0.1,
) -> torch.Tensor:
    """Share of the step's lower-bound clips (A < 0, r < L) that sit in high-entropy
    responses: the ceil(top_fraction * R) responses with the highest mean token entropy
    among the R non-empty ones (ties at the threshold all count as high).
    Needs (B, T) rows; NaN when nothing is clipped at the lower bound."""
    check_same_shape("ratio", ratio, mask=mask, entropy=entropy)
    require_2d("ratio", ratio, "high_entropy_lower_clip_share (responses are rows)")
    top_fraction = check_float("top_fraction", top_fraction, low=0.0, high=1.0, low_open=True)
    adv = broadcast_advantages(advantages.detach(), ratio, "ratio")
    m, t = _sanitised(mask, r=ratio, adv=adv, ent=entropy.to(ratio.dtype))
    n_tok = m.sum(-1)
    nonempty = n_tok > 0
    mean_ent = t["ent"].sum(-1) / n_tok.clamp_min(1).to(t["ent"].dtype)
    ranked = torch.where(nonempty, mean_ent, torch.full_like(mean_ent, -math.inf))
    ordered, _ = torch.sort(ranked, descending=True)
    k = torch.ceil(nonempty.sum().to(torch.float64) * top_fraction).long().clamp(1, ordered.numel())
    threshold = ordered[k - 1]
    high_rows = nonempty & (ranked >= threshold)

    low = lower_clipped(t["r"], t["adv"], m, lower)
    return safe_div((low & high_rows.unsqueeze(-1)).sum(), low.sum(), dtype=t["r"].dtype)


def k3_kl(log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(p || q) from tokens sampled from p: mean of (q/p - 1) - log(q/p).
    For mismatch/kl_rollout_train pass log_p = rollout log-probs, log_q = trainer ones.
    Non-negative per token, unbiased, low variance."""
    check_same_shape("log_p", log_p, log_q=log_q, mask=mask)
    m, t = _sanitised(mask, lp=log_p, lq=log_q.to(log_p.dtype))
    d = (t["lq"] - t["lp"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return masked_mean(torch.expm1(d) - d, m)


def token_prob_error(log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level multiplicative probability error: mean of exp(|log p - log q|) over the
    masked tokens (NeMo-RL's token_mult_prob_error; 1 when the two agree). For
    mismatch/token_prob_error pass the rollout's and the trainer's log-probs."""
    check_same_shape("log_p", log_p, log_q=log_q, mask=mask)
    m, t = _sanitised(mask, lp=log_p, lq=log_q.to(log_p.dtype))
    d = (t["lq"] - t["lp"]).abs().clamp(max=LOG_RATIO_CLAMP)
    return masked_mean(d.exp(), m)
