"""The BF16 shadow: its record and all its math, written once for the Trainer, the TRL trainer
and the verl worker (docs/rl.md, "Diagnostics" and "Calibrated Clipping").

A shadow step's record, `ShadowRows`, holds its FP8 log-probs (old and current), their BF16
shadows (the same weights with quantization off), the advantages, the mask and, where known,
the rollout's token entropy. Every function below takes the record:
  - `shadow_metrics`: FP8 against BF16 clipping and errors of the token ratios;
    `sequence_shadow_metrics` the same of GSPO's sequence ratios (`shadow/seq_*`);
    `estimate_noise` the per-pass noise S and C; `high_entropy_lower_clip_share` where in the
    batch FP8's lower clips sit;
  - `shadow_diagnostics`: all of these, the `shadow/*` metrics of one step;
  - `observe_shadow`: the ratios fed to the `CalibrationState` (its pool and, at its refit
    steps, a refit); a refit's result comes back as `calib/*` metrics whose new bounds are
    named `calib/next_lower` and `calib/next_upper`, since `calib/lower` and `calib/upper`
    stay the bounds this step used and the new ones apply from the next step;
  - `shadow_phase`: both on one record, at the state's ratio level (`level_ratios`: token
    ratios, or one sequence ratio per response); the state decides whether it takes them;
  - `response_stats`: one row per response of a shadow step (log.response_stats).
Where the tensors come from and gathering them across ranks are the callers' business.

Tensors are (B, T) rows or flat (n,) masked token vectors, so the statistics of several
mini-batches pool by concatenation. Results are detached 0-d tensors (no host sync); a
fraction of an empty set is NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from ._shapes import (
    as_bool_mask,
    broadcast_advantages,
    check_bounds,
    check_float,
    check_same_shape,
    require_2d,
    sanitised,
)
from .calibration import CalibrationResult
from .calibration_state import CalibrationState
from .clipping import (
    LOG_RATIO_CLAMP,
    SEQ_LOG_RATIO_MAX,
    lower_clipped,
    ratio,
    row_advantages,
    safe_div,
    sequence_log_ratio,
    sequence_ratio,
    upper_clipped,
)
from .loss_modes import RatioLevel, as_member

# -log 0.8: a log-ratio error this large moves a ratio of 1 across the nominal lower bound alone
LOG_RATIO_TAIL = 0.223
SD_KEY = "shadow/logprob_err_sd"
CORR_KEY = "shadow/old_new_err_corr"
NEXT_BOUNDS = {"calib/lower": "calib/next_lower", "calib/upper": "calib/next_upper"}


@dataclass
class ShadowRows:
    """A shadow step's rows, each FP8 value beside its BF16 shadow (after `gathered`, the rows
    of every rank)."""

    log_prob: torch.Tensor  # (b, T) the FP8 log-probs the loss saw, detached
    old_log_prob: torch.Tensor  # (b, T) the old log-probs the loss saw
    log_prob_shadow: torch.Tensor  # (b, T) the BF16 shadow of log_prob (shadow pass 2)
    old_log_prob_shadow: torch.Tensor  # (b, T) the BF16 shadow of old_log_prob (shadow pass 1)
    advantages: torch.Tensor  # (b,) per response, or one per token like log_prob
    mask: torch.Tensor  # (b, T) response mask
    entropy: torch.Tensor | None = None  # (b, T) the rollout's token entropy

    def gathered(self, dp) -> ShadowRows:
        """Every rank's rows, in rank order, so calibration and the diagnostics see the global
        batch (`dp`: a data-parallel seam with `gather_rows`)."""
        return ShadowRows(**dp.gather_rows({f.name: getattr(self, f.name) for f in fields(self)}))

    def ratios(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, r_shadow): the FP8 and the BF16 token ratios."""
        return (
            ratio(self.log_prob, self.old_log_prob),
            ratio(self.log_prob_shadow, self.old_log_prob_shadow),
        )

    def token_advantages(self) -> torch.Tensor:
        """The advantages broadcast to one per token, detached, in the log-probs' dtype."""
        return broadcast_advantages(self.advantages.detach(), self.log_prob, "log_prob")

    def expanded_advantages(self) -> torch.Tensor:
        """Per-response advantages of (B, T) rows expanded to one per token (a view, the
        dtype kept); per-token ones as they are."""
        adv = self.advantages
        if adv.dim() == 1 and self.log_prob.dim() == 2:
            return adv.unsqueeze(1).expand_as(self.log_prob)
        return adv

    def checked(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(bool mask, {lp, old, lp_shadow, old_shadow, adv}) detached, padding set to 0, after
        checking that the log-probs and the mask share one shape."""
        check_same_shape(
            "log_prob",
            self.log_prob,
            old_log_prob=self.old_log_prob,
            log_prob_shadow=self.log_prob_shadow,
            old_log_prob_shadow=self.old_log_prob_shadow,
            mask=self.mask,
        )
        return sanitised(
            self.mask,
            lp=self.log_prob,
            old=self.old_log_prob,
            lp_shadow=self.log_prob_shadow,
            old_shadow=self.old_log_prob_shadow.to(self.log_prob.dtype),
            adv=self.token_advantages(),
        )


def _is_sequence(level: RatioLevel | str) -> bool:
    if not isinstance(level, RatioLevel):
        level = as_member(RatioLevel, level, "ratio level")
    return level is RatioLevel.SEQUENCE


# ---------------------------------------------------------------- token ratios


def shadow_metrics(
    rows: ShadowRows, *, bounds: tuple[float, float], nominal: tuple[float, float]
) -> dict:
    """FP8 vs BF16-shadow statistics of one step's token ratios (docs/rl.md, "Diagnostics":
    the names too). `bounds` are the (L, H) in use, `nominal` the (l0, h0) the BF16 shadow is
    clipped with."""
    m, t = rows.checked()
    lower, upper = check_bounds("bounds", bounds)
    l0, h0 = check_bounds("nominal", nominal)
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


# ---------------------------------------------------------------- sequence ratios (GSPO)


def sequence_shadow_metrics(
    rows: ShadowRows, *, bounds: tuple[float, float], nominal: tuple[float, float]
) -> dict:
    """FP8 vs BF16-shadow statistics of GSPO's sequence ratios, one per response with a token
    (docs/rl.md, "Diagnostics"): the lower clips of the negative-advantage responses, FP8's
    s at the lower bound in use and the shadow's shat at the nominal one, and the sequence
    log-ratio error e = log s - log shat (both clamped at 10, as the loss clamps them): its sd,
    and the share of responses with |e| > -log l0 (an error that alone moves a ratio of 1
    across the nominal lower bound). (B, T) rows; a response's advantage is its tokens' mean."""
    require_2d("log_prob", rows.log_prob, "sequence_shadow_metrics (responses are rows)")
    lower, _ = check_bounds("bounds", bounds)
    l0, _ = check_bounds("nominal", nominal)
    m, t = rows.checked()
    responses, a = m.any(-1), row_advantages(t["adv"], m)
    log_s = sequence_log_ratio(t["lp"], t["old"], m).clamp(max=SEQ_LOG_RATIO_MAX)
    log_s_shadow = sequence_log_ratio(t["lp_shadow"], t["old_shadow"], m).clamp(
        max=SEQ_LOG_RATIO_MAX
    )
    low_fp8 = lower_clipped(torch.exp(log_s), a, responses, lower)
    low_bf16 = lower_clipped(torch.exp(log_s_shadow), a, responses, l0)
    n_seq = responses.sum().to(log_s.dtype)
    n_neg = (responses & (a < 0)).sum().to(log_s.dtype)
    zero = torch.zeros_like(log_s)
    e = torch.where(responses, log_s - log_s_shadow, zero)
    e_var = safe_div(
        torch.where(responses, (e - safe_div(e.sum(), n_seq)) ** 2, zero).sum(), n_seq - 1
    )
    tail = (responses & (e.abs() > -math.log(l0))).sum()
    return {
        "shadow/seq_lower_clipfrac_neg_fp8": safe_div(low_fp8.sum(), n_neg),
        "shadow/seq_lower_clipfrac_neg_bf16": safe_div(low_bf16.sum(), n_neg),
        "shadow/seq_lower_clip_excess": safe_div(low_fp8.sum() - low_bf16.sum(), n_neg),
        "shadow/seq_logratio_err_sd": torch.sqrt(e_var),
        "shadow/seq_logratio_err_tail": safe_div(tail, n_seq),
    }


# ---------------------------------------------------------------- noise and entropy


def estimate_noise(rows: ShadowRows) -> dict:
    """S and C of the FP8 errors e = FP8 log-prob - BF16 shadow log-prob of the old and the
    new pass on the same (masked) tokens, as detached 0-d tensors (no host sync):

    shadow/logprob_err_sd     S = sqrt((var(e_old) + var(e_new)) / 2), pooled over both passes
    shadow/old_new_err_corr   C = cov(e_old, e_new) / S^2

    The pooled S^2 as the correlation's denominator makes 2 S^2 (1 - C) equal the variance of
    the log-ratio error e_new - e_old exactly, so noise injected with (S, C) (rl/noise.py)
    reproduces the measured ratio noise even when the two passes' error sds differ. Errors
    are centred per pass (a bias common to both cancels in the ratio). NaN with fewer than 2
    tokens; C is NaN when S is 0 (identical passes, nothing to correlate).
    """
    check_same_shape(
        "old_log_prob",
        rows.old_log_prob,
        old_log_prob_shadow=rows.old_log_prob_shadow,
        log_prob=rows.log_prob,
        log_prob_shadow=rows.log_prob_shadow,
        mask=rows.mask,
    )
    m = as_bool_mask(rows.mask)
    dtype = torch.promote_types(rows.log_prob.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=rows.log_prob.device)

    def err(fp8, shadow):
        return torch.where(m, fp8.detach().to(dtype) - shadow.detach().to(dtype), zero)

    e_old = err(rows.old_log_prob, rows.old_log_prob_shadow)
    e_new = err(rows.log_prob, rows.log_prob_shadow)
    n = m.sum().to(dtype)
    # Unbiased (n - 1) moments; n < 2 gives a 0 or negative denominator, hence NaN below.
    dof = torch.where(n >= 2, n - 1, torch.zeros_like(n))
    c_old = torch.where(m, e_old - safe_div(e_old.sum(), n), zero)
    c_new = torch.where(m, e_new - safe_div(e_new.sum(), n), zero)
    var = safe_div((c_old.square().sum() + c_new.square().sum()) / 2, dof)
    cov = safe_div((c_old * c_new).sum(), dof)
    return {SD_KEY: var.sqrt().detach(), CORR_KEY: safe_div(cov, var).detach()}


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
    m, t = sanitised(mask, r=ratio, adv=adv, ent=entropy.to(ratio.dtype))
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


# ---------------------------------------------------------------- one step's shadow phase


def shadow_diagnostics(
    rows: ShadowRows,
    *,
    bounds: tuple[float, float],
    nominal: tuple[float, float],
    level: RatioLevel | str = RatioLevel.TOKEN,
) -> dict:
    """The `shadow/*` metrics as detached 0-d tensors: `shadow_metrics` and `estimate_noise`;
    given the record's entropy (rows) `shadow/high_entropy_lower_clip_share`, and at
    level="sequence" the `shadow/seq_*` metrics of GSPO's sequence ratios (rows too)."""
    metrics = shadow_metrics(rows, bounds=bounds, nominal=nominal)
    if _is_sequence(level):
        metrics.update(sequence_shadow_metrics(rows, bounds=bounds, nominal=nominal))
    metrics.update(estimate_noise(rows))
    if rows.entropy is not None:
        metrics["shadow/high_entropy_lower_clip_share"] = high_entropy_lower_clip_share(
            ratio(rows.log_prob, rows.old_log_prob),
            rows.advantages,
            rows.mask,
            rows.entropy,
            bounds[0],
        )
    return metrics


def refit_metrics(result: CalibrationResult) -> dict[str, float]:
    """A refit's `calib/*` metrics, its bounds named as the next step's (`calib/next_*`)."""
    metrics = result.metrics()
    next_bounds = {new: metrics.pop(old) for old, new in NEXT_BOUNDS.items()}
    return {**metrics, **next_bounds}


def observe_shadow(
    state: CalibrationState,
    step: int,
    r: torch.Tensor,
    r_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """`state.observe` on the step's FP8 ratios `r` and BF16 shadow ratios `r_shadow` (the whole
    global batch, so every rank refits alike): `refit_metrics` at a refit step, else {}."""
    result = state.observe(step, r, r_shadow, advantages, mask)
    return {} if result is None else refit_metrics(result)


def level_ratios(
    rows: ShadowRows, level: RatioLevel | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r, r_shadow, advantages, mask) of the ratios a loss at this level clips: per token, or
    (sequence) one GSPO ratio, advantage (its tokens' mean) and flag per (B, T) row."""
    r, r_shadow = rows.ratios()
    if not _is_sequence(level):
        return r, r_shadow, rows.expanded_advantages(), rows.mask
    require_2d("log_prob", rows.log_prob, "level='sequence' (responses are rows)")
    m = as_bool_mask(rows.mask)
    return (
        sequence_ratio(rows.log_prob, rows.old_log_prob, m),
        sequence_ratio(rows.log_prob_shadow, rows.old_log_prob_shadow, m),
        row_advantages(rows.token_advantages(), m),
        m.any(-1),
    )


def shadow_phase(
    rows: ShadowRows, *, state: CalibrationState, step: int, bounds: tuple[float, float]
) -> dict:
    """`shadow_diagnostics` (against the state's nominal bounds) and, where the state takes
    observations (`state.refits`), the ratios fed to it (`observe_shadow`): one dict of
    metrics, both at the state's ratio level (`state.level`)."""
    metrics = shadow_diagnostics(rows, bounds=bounds, nominal=state.nominal, level=state.level)
    if state.refits:
        metrics.update(observe_shadow(state, step, *level_ratios(rows, state.level)))
    return metrics


def response_stats(rows: ShadowRows, lower: float, step: int) -> list[dict]:
    """One row per response: its mean token entropy, length, advantage, and whether any of
    its tokens was lower-clipped under the FP8 ratio and under the BF16 shadow's (read back
    once). (B, T) rows with per-response advantages and entropy."""
    r, r_shadow = rows.ratios()
    adv = rows.expanded_advantages()
    m = rows.mask.bool()
    length = m.sum(1)
    stats = torch.stack(
        [
            torch.where(m, rows.entropy.float(), 0).sum(1) / length.clamp_min(1),
            length.float(),
            adv[:, 0].float(),
            lower_clipped(r, adv, m, lower).any(1).float(),
            lower_clipped(r_shadow, adv, m, lower).any(1).float(),
        ],
        1,
    ).tolist()
    return [
        {
            "step": step,
            "entropy": e,
            "length": int(n),
            "adv": a,
            "lower_clip_fp8": bool(f),
            "lower_clip_bf16": bool(b),
        }
        for e, n, a, f, b in stats
    ]
