"""Calibrated Clipping: the bound-fitting function, the rule table, and its result.

At a refit, the FP8 ratios r and the BF16 shadow ratios rhat of the pooled tokens give new
clip bounds. The lower bound is moved so that FP8 clips as many negative-advantage tokens as
BF16 clips at the nominal bound, the upper bound so that the positive / negative balance of
the gradient-carrying mass matches BF16's. Both moves are capped.

The rules are the rows of `RULES` (docs/rl.md, "The rule table"): `paper`, Algorithm 1 as the
paper states it (interpolated quantile, H* solved against L*); `pooled` (the default), which
takes the lower order statistic, keeps the nominal bound where FP8 already clips as often as
BF16, and solves H against the capped L the loss will use; two candidates (issue 45), both
`pooled` otherwise: `direct-first`, whose first refit goes straight to its targets, and
`noise-scaled`, whose caps scale with the measured noise. Which tokens are pooled, and
which refit is the first, is the caller's business (`CalibrationState` keeps the pool and
the history).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

import torch

from ._shapes import as_bool_mask, broadcast_advantages, check_bounds, check_float, check_same_shape

# Open ends of L < 1 < H. 1e-6 is exact enough in float32 that the loss, which compares
# ratios in their own dtype, sees L < 1 < H.
LOWER_CEIL = 1.0 - 1e-6
UPPER_FLOOR = 1.0 + 1e-6
# A cumulative sum that is within this fraction of the total positive mass of the target
# counts as reaching it: rounding must not push H* one token further than needed.
_REACH_RTOL = 1e-9

NAN = float("nan")
# The noise at which a noise-scaled rule's caps are the configured ones: fp8-rowwise's token
# log-ratio error sd on the toy (docs/fp8.md, the noise table: 0.0252), the default recipe.
NOISE_REFERENCE_SD = 0.025


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of one calibrate_bounds call (all plain Python numbers).

    lower, upper:               the bounds to use from the next step (L_t, H_t)
    lower_target, upper_target: L*, H* before the smoothing caps (NaN when not computed)
    alpha:   BF16 lower-clip fraction of N at l0;  rho_ref: pos(rhat; h0) / neg(rhat; l0)
    rho:     pos(r; H_t) / neg(r; L_t)
    rho_target: the balance the upper bound was solved for: at (L*, H*) for `paper`,
             at (L_t, H*) for `pooled`
    lower_clipfrac: FP8 lower-clip fraction of N at L_t
    k:       BF16 lower clips of N at l0 (alpha |N|); pool_steps: shadow steps pooled
    updated: False when the previous bounds were kept, `reason` says why.
    """

    lower: float
    upper: float
    alpha: float
    rho_ref: float
    rho: float
    lower_target: float
    upper_target: float
    updated: bool
    reason: str = ""
    rho_target: float = NAN
    lower_clipfrac: float = NAN
    n_neg: int = 0
    n_pos: int = 0
    k: int = 0
    pool_steps: int = 1
    rule: str = "pooled"

    def metrics(self) -> dict[str, float]:
        return {
            "calib/lower": self.lower,
            "calib/upper": self.upper,
            "calib/alpha": self.alpha,
            "calib/rho": self.rho,
            "calib/rho_ref": self.rho_ref,
            "calib/rho_target": self.rho_target,
            "calib/lower_target": self.lower_target,
            "calib/upper_target": self.upper_target,
            "calib/lower_clipfrac_neg": self.lower_clipfrac,
            "calib/updated": float(self.updated),
            "calib/n_neg": float(self.n_neg),
            "calib/n_pos": float(self.n_pos),
            "calib/k": float(self.k),
            "calib/pool_steps": float(self.pool_steps),
            "calib/pool_neg_tokens": float(self.n_neg),
        }

    def as_dict(self) -> dict:
        """JSON-safe: non-finite floats become None (JSON has no NaN)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict) -> CalibrationResult:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"CalibrationResult.from_dict: unknown key(s) {unknown}")
        return cls(**{k: (NAN if v is None else v) for k, v in d.items()})


def pair(name: str, value) -> tuple[float, float]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair, got {value!r}") from None
    return (
        check_float(f"{name}[0]", a, low=0.0, high=math.inf, high_open=True),
        check_float(f"{name}[1]", b, low=0.0, high=math.inf, high_open=True),
    )


def check_rule(rule) -> str:
    """`rule` if it names a row of RULES, else ValueError listing them."""
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"unknown calibration rule {rule!r}; valid: {', '.join(RULES)}")
    return rule


def calibrate_bounds(
    ratio: torch.Tensor,
    ratio_shadow: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    nominal: tuple[float, float],
    previous: tuple[float, float],
    rule: str = "pooled",
    max_step: tuple[float, float] | None = (0.05, 0.1),
    min_tokens: int = 32,
    upper_max: float | None = None,
    lower_min: float = 0.05,
) -> CalibrationResult:
    """New clip bounds (L_t, H_t) from FP8 ratios and their BF16 shadows (already pooled).

    ratio (FP8 r), ratio_shadow (BF16 rhat), mask: (B, T) or flat (n,), same shape;
    advantages: same shape or (B,). nominal = (l0, h0), previous = (L_prev, H_prev),
    max_step = (delta_L, delta_H), upper_max = H_max (default 1 + 4 (h0 - 1)).
    rule: a name in RULES (docs/rl.md); max_step None: no caps (L_t = L*, H_t = H*).
    Keeps the previous bounds (updated=False) when |N| or |P| < min_tokens or when
    every negative token is clipped in BF16 (rho_ref undefined).
    Deterministic, O(n log n) (two sorts), computed in float64, no loop over tokens; it
    syncs with the device a few times (NaN check, index sets, results).
    Raises ValueError on NaN/inf (or a negative ratio) at a masked-in token.
    """
    check_same_shape("ratio", ratio, ratio_shadow=ratio_shadow, mask=mask)
    st = _settings(nominal, previous, rule, max_step, min_tokens, upper_max, lower_min)
    s = _token_sets(ratio, ratio_shadow, advantages, mask)
    ref = _reference(s, st)
    reason = _reason_to_keep(s, st, ref)
    if reason:
        return _kept(s, st, ref, reason)
    if RULES[rule].noise_scaled_caps and max_step is not None:
        st = _noise_scaled(s, st)
    return _result(s, st, ref, RULES[rule].fit(s, st, ref))


@dataclass(frozen=True)
class _Settings:
    """calibrate_bounds' checked scalars: nominal (l0, h0), previous (l_prev, h_prev), the
    caps (d_low, d_up) per refit, the floor of L and the ceiling H_max of H."""

    l0: float
    h0: float
    l_prev: float
    h_prev: float
    d_low: float | torch.Tensor  # a tensor when the noise scales them (noise-scaled)
    d_up: float | torch.Tensor
    min_tokens: int
    lower_min: float
    h_max: float
    rule: str


def _settings(nominal, previous, rule, max_step, min_tokens, upper_max, lower_min) -> _Settings:
    check_rule(rule)
    l0, h0 = check_bounds("nominal", nominal)
    l_prev, h_prev = check_bounds("previous", previous)
    d_low, d_up = (math.inf, math.inf) if max_step is None else pair("max_step", max_step)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
        raise ValueError(f"min_tokens must be a positive int, got {min_tokens!r}")
    lower_min = check_float(
        "lower_min", lower_min, low=0.0, high=LOWER_CEIL, low_open=True, high_open=True
    )
    h_max = 1.0 + 4.0 * (h0 - 1.0) if upper_max is None else upper_max
    h_max = check_float("upper_max", h_max, low=UPPER_FLOOR, high=math.inf, high_open=True)
    return _Settings(l0, h0, l_prev, h_prev, d_low, d_up, min_tokens, lower_min, h_max, rule)


@dataclass
class _Sets:
    """The ratios and |A| of N (negative advantages) and P (positive) in float64."""

    r_n: torch.Tensor
    rh_n: torch.Tensor
    a_n: torch.Tensor
    r_p: torch.Tensor
    rh_p: torch.Tensor
    a_p: torch.Tensor

    def pos(self, x, upper):  # pos(x; H) over P
        return torch.where(x <= upper, self.a_p * x, 0.0).sum()

    def neg(self, x, lower):  # neg(x; L) over N
        return torch.where(x >= lower, self.a_n * x, 0.0).sum()


def _token_sets(ratio, ratio_shadow, advantages, mask) -> _Sets:
    """N and P of the masked-in tokens, after one check (one sync) that they are finite."""
    f64 = torch.float64
    m = as_bool_mask(mask).reshape(-1)
    r = ratio.detach().reshape(-1).to(f64)
    rh = ratio_shadow.detach().reshape(-1).to(f64)
    adv = broadcast_advantages(advantages.detach(), ratio, "ratio").reshape(-1).to(f64)

    bad = torch.stack(
        [
            (m & ~(torch.isfinite(r) & (r >= 0))).sum(),
            (m & ~(torch.isfinite(rh) & (rh >= 0))).sum(),
            (m & ~torch.isfinite(adv)).sum(),
        ]
    ).tolist()
    for name, count in zip(("ratio", "ratio_shadow", "advantages"), bad, strict=True):
        if count:
            what = "NaN/inf" if name == "advantages" else "NaN/inf or negative"
            raise ValueError(
                f"calibrate_bounds: {name} has {count} {what} value(s) at masked-in tokens"
            )
    neg_set, pos_set = m & (adv < 0), m & (adv > 0)
    return _Sets(r[neg_set], rh[neg_set], -adv[neg_set], r[pos_set], rh[pos_set], adv[pos_set])


@dataclass(frozen=True)
class _Reference:
    """What BF16 does at the nominal bounds: k lower clips of N (alpha = k / |N|), the
    balance rho_ref = pos(rhat; h0) / neg(rhat; l0) and its denominator (0-d float64)."""

    k: torch.Tensor
    alpha: torch.Tensor
    neg: torch.Tensor
    rho: torch.Tensor


def _reference(s: _Sets, st: _Settings) -> _Reference:
    n_neg, n_pos = s.r_n.numel(), s.r_p.numel()
    nan = torch.tensor(NAN, dtype=torch.float64, device=s.r_n.device)
    k_t = (s.rh_n < st.l0).sum()
    alpha = k_t.to(torch.float64) / n_neg if n_neg else nan
    neg_shadow = s.neg(s.rh_n, st.l0)
    rho_ref = s.pos(s.rh_p, st.h0) / neg_shadow if n_neg and n_pos else nan
    return _Reference(k_t, alpha, neg_shadow, rho_ref)


def _reason_to_keep(s: _Sets, st: _Settings, ref: _Reference) -> str:
    """Why the previous bounds stay ("" when they can be refit)."""
    n_neg, n_pos = s.r_n.numel(), s.r_p.numel()
    if n_neg < st.min_tokens or n_pos < st.min_tokens:
        return f"too few tokens: |N|={n_neg}, |P|={n_pos}, min_tokens={st.min_tokens}"
    if not ref.neg > 0:
        return "every negative-advantage token is clipped in BF16 at l0: rho_ref undefined"
    return ""


def _kept(s: _Sets, st: _Settings, ref: _Reference, reason: str) -> CalibrationResult:
    """The previous bounds, with the statistics that can still be computed."""
    f64, n_neg, n_pos = torch.float64, s.r_n.numel(), s.r_p.numel()
    nan = torch.tensor(NAN, dtype=f64, device=s.r_n.device)
    rho_prev = s.pos(s.r_p, st.h_prev) / s.neg(s.r_n, st.l_prev) if n_neg and n_pos else nan
    clip_prev = (s.r_n < st.l_prev).sum().to(f64) / n_neg if n_neg else nan
    stats = (ref.alpha, ref.rho, rho_prev, clip_prev, ref.k)
    a, rr, rp, cp, k = torch.stack([torch.as_tensor(x, dtype=f64) for x in stats]).tolist()
    return CalibrationResult(
        lower=st.l_prev,
        upper=st.h_prev,
        alpha=a,
        rho_ref=rr,
        rho=rp,
        lower_target=NAN,
        upper_target=NAN,
        updated=False,
        reason=reason,
        lower_clipfrac=cp,
        n_neg=n_neg,
        n_pos=n_pos,
        k=int(k),
        rule=st.rule,
    )


@dataclass(frozen=True)
class _Fit:
    """A rule's new bounds (0-d float64): targets L*, H*, capped L_t, H_t, and the lower
    bound H* was solved against."""

    l_star: torch.Tensor
    l_t: torch.Tensor
    h_star: torch.Tensor
    h_t: torch.Tensor
    l_solve: torch.Tensor


def _fit_paper(s: _Sets, st: _Settings, ref: _Reference) -> _Fit:
    """Algorithm 1 as the paper states it: L* the interpolated alpha-quantile of r over N,
    H* solved against L*."""
    n_neg = s.r_n.numel()
    s_n, _ = torch.sort(s.r_n)
    # Linear interpolation as torch.quantile. With alpha = k / |N| (0 < k < |N|) the rank
    # alpha (|N| - 1) lies strictly between k - 1 and k, so L* falls in (s[k-1], s[k]] and
    # clips exactly k tokens when values are distinct; with r == rhat, exactly the tokens l0
    # clips, ties included.
    rank = ref.alpha * (n_neg - 1)
    below = rank.floor().long()
    above = (below + 1).clamp(max=n_neg - 1)
    l_star, l_t = _capped_lower(torch.lerp(s_n[below], s_n[above], rank - below.to(s_n.dtype)), st)
    h_star, _, _ = _upper_reaching(s, ref.rho * s.neg(s.r_n, l_star), st.h_max)
    h_star = h_star.clamp(UPPER_FLOOR, st.h_max)
    h_t = h_star.clamp(st.h_prev - st.d_up, st.h_prev + st.d_up)
    return _Fit(l_star, l_t, h_star, h_t, l_solve=l_star)


def _fit_pooled(s: _Sets, st: _Settings, ref: _Reference) -> _Fit:
    """The default: L* the k-th smallest FP8 ratio (nominal where FP8 already clips as
    often as BF16), H* solved against the capped L_t the loss will use, h0 kept where it
    carries the target mass, H_t kept within (1, H_max]."""
    s_n, _ = torch.sort(s.r_n)
    # The k-th smallest FP8 ratio (the smallest for k = 0): with the strict r < L test it
    # clips k - 1 of these tokens and about k / (n + 1) of new ones, where the quantile
    # clips about (k + 1) / (n + 1).
    c_t = (s.r_n < st.l0).sum()
    kth = s_n[(ref.k - 1).clamp(min=0)]
    l_star, l_t = _capped_lower(torch.where(c_t == ref.k, torch.full_like(kth, st.l0), kth), st)
    h_star, j, s_p = _upper_reaching(s, ref.rho * s.neg(s.r_n, l_t), st.h_max)
    h_star = _nominal_upper_if_enough(h_star, j, s_p, st.h0).clamp(UPPER_FLOOR, st.h_max)
    h_t = h_star.clamp(st.h_prev - st.d_up, st.h_prev + st.d_up)
    h_t = h_t.clamp(UPPER_FLOOR, st.h_max)  # even when the previous bound was not
    return _Fit(l_star, l_t, h_star, h_t, l_solve=l_t)


@dataclass(frozen=True)
class CalibrationRule:
    """One row of the rule table: what a rule fits and on which shadow steps.

    fit:        (token sets, settings, BF16 reference) -> the targets and the capped bounds
    first_step: the first step whose shadow statistics count; refits at t >= first_step with
                t % interval == 0 (1: step 0 never counts, Adam's first update moves the
                policy atypically far)
    pools:      fit on the pool of recent shadow steps, else on the refit step's tokens alone
    uncapped_first_refit: the first refit that moves the bounds goes straight to its targets;
                the caps limit only the later ones
    noise_scaled_caps: the caps times sd / NOISE_REFERENCE_SD, sd the fit set's log-ratio
                error sd (`_noise_scaled`)
    """

    name: str
    fit: Callable[[_Sets, _Settings, _Reference], _Fit]
    first_step: int
    pools: bool
    uncapped_first_refit: bool = False
    noise_scaled_caps: bool = False

    def first_refit_step(self, interval: int) -> int:
        """The first t >= first_step with t % interval == 0."""
        return -(-self.first_step // interval) * interval


RULES: dict[str, CalibrationRule] = {
    row.name: row
    for row in (
        CalibrationRule("pooled", _fit_pooled, first_step=1, pools=True),
        CalibrationRule("paper", _fit_paper, first_step=0, pools=False),
        # a candidate (issue 45): the caps' walk to a far target is what leaves NVFP4's excess
        CalibrationRule(
            "direct-first", _fit_pooled, first_step=1, pools=True, uncapped_first_refit=True
        ),
        # a candidate (issue 45): the target's distance from l0 grows with the noise
        CalibrationRule(
            "noise-scaled", _fit_pooled, first_step=1, pools=True, noise_scaled_caps=True
        ),
    )
}


def _noise_scaled(s: _Sets, st: _Settings) -> _Settings:
    """The caps times sd / NOISE_REFERENCE_SD, sd the sample sd of log r - log rhat over the
    fit set's N and P tokens (those with both ratios > 0)."""
    e = torch.cat([s.r_n, s.r_p]).log() - torch.cat([s.rh_n, s.rh_p]).log()
    e = e[torch.isfinite(e)]
    sd = e.std() if e.numel() > 1 else e.new_zeros(())  # stays on the device: no sync
    scale = sd / NOISE_REFERENCE_SD
    return replace(st, d_low=st.d_low * scale, d_up=st.d_up * scale)


def _capped_lower(l_star: torch.Tensor, st: _Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """(L* within [lower_min, LOWER_CEIL], L_t within max_step of the previous bound)."""
    l_star = l_star.clamp(st.lower_min, LOWER_CEIL)
    return l_star, l_star.clamp(st.l_prev - st.d_low, st.l_prev + st.d_low)


def _upper_reaching(s: _Sets, target: torch.Tensor, h_max: float):
    """(H*, j, sorted P ratios): the fewest P tokens, smallest ratio first, whose A r
    reaches `target` (pos(r; H) is a step function of H); j of them are included (0: H = 1
    already suffices; n_pos + 1: none reaches, H_max)."""
    n_pos = s.r_p.numel()
    s_p, order = torch.sort(s.r_p)
    prefix = torch.cat([s_p.new_zeros(1), torch.cumsum(s.a_p[order] * s_p, 0)])
    j = torch.searchsorted(prefix, (target - _REACH_RTOL * prefix[-1]).reshape(1)).squeeze(0)
    last_included = s_p[(j - 1).clamp(0, n_pos - 1)].clamp_min(1.0)
    h_star = torch.where(
        j == 0,
        torch.ones_like(last_included),
        torch.where(j > n_pos, torch.full_like(last_included, h_max), last_included),
    )
    return h_star, j, s_p


def _nominal_upper_if_enough(h_star, j, s_p, h0: float) -> torch.Tensor:
    """h0 where it carries exactly the mass of the first j tokens (u_j <= h0 < u_{j+1})."""
    n_pos = s_p.numel()
    nxt = torch.cat([s_p, s_p.new_full((1,), math.inf)])[j.clamp(max=n_pos)]
    lo_ok = (j == 0) | (s_p[(j - 1).clamp(0, n_pos - 1)] <= h0)
    return torch.where((j <= n_pos) & lo_ok & (h0 < nxt), torch.full_like(h_star, h0), h_star)


def _result(s: _Sets, st: _Settings, ref: _Reference, fit: _Fit) -> CalibrationResult:
    """The refit's CalibrationResult: every statistic read back in one sync."""
    f64, n_neg = torch.float64, s.r_n.numel()
    rho = s.pos(s.r_p, fit.h_t) / s.neg(s.r_n, fit.l_t)
    rho_target = s.pos(s.r_p, fit.h_star) / s.neg(s.r_n, fit.l_solve)
    clipfrac = (s.r_n < fit.l_t).sum().to(f64) / n_neg
    vals = torch.stack(
        [
            *(fit.l_t, fit.h_t, ref.alpha, ref.rho, rho, fit.l_star, fit.h_star),
            *(rho_target, clipfrac, ref.k.to(f64)),
        ]
    ).tolist()
    lt, ht, a, rr, rho_v, ls, hs, rt, cf, k = vals
    return CalibrationResult(
        lower=lt,
        upper=ht,
        alpha=a,
        rho_ref=rr,
        rho=rho_v,
        lower_target=ls,
        upper_target=hs,
        updated=True,
        rho_target=rt,
        lower_clipfrac=cf,
        n_neg=n_neg,
        n_pos=s.r_p.numel(),
        k=int(k),
        rule=st.rule,
    )
