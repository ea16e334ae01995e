"""Calibrated Clipping, the spec's Algorithm 1 (section 4), and the state a trainer keeps.

At a calibration step the FP8 ratios r and the BF16 shadow ratios rhat of all mini-batches
are pooled. The lower bound is moved so that FP8 clips as many negative-advantage tokens as
BF16 clips at the nominal bound (quantile match), the upper bound so that the positive /
negative balance of the gradient-carrying mass matches BF16's. Both moves are capped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch

from ._shapes import as_bool_mask, broadcast_advantages, check_bounds, check_float, check_same_shape

# Open ends of L < 1 < H (spec: L* in [L_min, 1), H* >= 1 with 1 < H_t). 1e-6 is exact
# enough in float32 that the loss, which compares ratios in their own dtype, sees L < 1 < H.
LOWER_CEIL = 1.0 - 1e-6
UPPER_FLOOR = 1.0 + 1e-6
# A cumulative sum that is within this fraction of the total positive mass of the target
# counts as reaching it: rounding must not push H* one token further than needed.
_REACH_RTOL = 1e-9

NAN = float("nan")


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of one calibrate_bounds call (all plain Python numbers).

    lower, upper:               the bounds to use from the next step (L_t, H_t)
    lower_target, upper_target: L*, H* before the smoothing caps (NaN when not computed)
    alpha:   BF16 lower-clip fraction of N at l0;  rho_ref: pos(rhat; h0) / neg(rhat; l0)
    rho:     pos(r; H_t) / neg(r; L_t);            rho_target: the same at (L*, H*)
    lower_clipfrac: FP8 lower-clip fraction of N at L_t
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
        }

    def as_dict(self) -> dict:
        """JSON-safe: non-finite floats become None (JSON has no NaN)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> CalibrationResult:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"CalibrationResult.from_dict: unknown key(s) {unknown}")
        return cls(**{k: (NAN if v is None else v) for k, v in d.items()})


def _pair(name: str, value) -> tuple[float, float]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair, got {value!r}") from None
    return (check_float(f"{name}[0]", a, low=0.0, high=math.inf, high_open=True),
            check_float(f"{name}[1]", b, low=0.0, high=math.inf, high_open=True))


def calibrate_bounds(
    ratio: torch.Tensor,
    ratio_ref: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    nominal: tuple[float, float],
    previous: tuple[float, float],
    max_step: tuple[float, float] = (0.05, 0.1),
    min_tokens: int = 32,
    upper_max: float | None = None,
    lower_min: float = 0.05,
) -> CalibrationResult:
    """Algorithm 1: new clip bounds (L_t, H_t) from pooled FP8 and BF16 ratios.

    ratio (FP8 r), ratio_ref (BF16 rhat), mask: (B, T) or flat (n,), same shape;
    advantages: same shape or (B,). nominal = (l0, h0), previous = (L_prev, H_prev),
    max_step = (delta_L, delta_H). upper_max = H_max, default 1 + 4 (h0 - 1).
    Keeps the previous bounds (updated=False) when |N| or |P| < min_tokens or when
    every negative token is clipped in BF16 (rho_ref undefined).
    Deterministic, O(n log n) (two sorts), computed in float64, no loop over tokens; it
    syncs with the device a few times (NaN check, index sets, rho_ref check, results).
    Raises ValueError on NaN/inf (or a negative ratio) at a masked-in token.
    """
    check_same_shape("ratio", ratio, ratio_ref=ratio_ref, mask=mask)
    l0, h0 = check_bounds("nominal", nominal)
    l_prev, h_prev = check_bounds("previous", previous)
    d_low, d_up = _pair("max_step", max_step)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
        raise ValueError(f"min_tokens must be a positive int, got {min_tokens!r}")
    lower_min = check_float("lower_min", lower_min, low=0.0, high=LOWER_CEIL, low_open=True, high_open=True)
    h_max = 1.0 + 4.0 * (h0 - 1.0) if upper_max is None else upper_max
    h_max = check_float("upper_max", h_max, low=UPPER_FLOOR, high=math.inf, high_open=True)

    f64 = torch.float64
    m = as_bool_mask(mask).reshape(-1)
    r = ratio.detach().reshape(-1).to(f64)
    rh = ratio_ref.detach().reshape(-1).to(f64)
    adv = broadcast_advantages(advantages.detach(), ratio, "ratio").reshape(-1).to(f64)

    bad = torch.stack([
        (m & ~(torch.isfinite(r) & (r >= 0))).sum(),
        (m & ~(torch.isfinite(rh) & (rh >= 0))).sum(),
        (m & ~torch.isfinite(adv)).sum(),
    ]).tolist()
    for name, count in zip(("ratio", "ratio_ref", "advantages"), bad):
        if count:
            what = "NaN/inf" if name == "advantages" else "NaN/inf or negative"
            raise ValueError(f"calibrate_bounds: {name} has {count} {what} value(s) at masked-in tokens")

    neg_set, pos_set = m & (adv < 0), m & (adv > 0)
    r_n, rh_n, a_n = r[neg_set], rh[neg_set], -adv[neg_set]  # a_n = |A| on N
    r_p, rh_p, a_p = r[pos_set], rh[pos_set], adv[pos_set]
    n_neg, n_pos = r_n.numel(), r_p.numel()

    def pos_mass(x, upper):  # pos(x; H) over P
        return torch.where(x <= upper, a_p * x, 0.0).sum()

    def neg_mass(x, lower):  # neg(x; L) over N
        return torch.where(x >= lower, a_n * x, 0.0).sum()

    nan = torch.tensor(NAN, dtype=f64, device=r.device)
    alpha = (rh_n < l0).sum().to(f64) / n_neg if n_neg else nan
    pos_ref, neg_ref = pos_mass(rh_p, h0), neg_mass(rh_n, l0)
    rho_ref = pos_ref / neg_ref if n_neg and n_pos else nan

    reason = ""
    if n_neg < min_tokens or n_pos < min_tokens:
        reason = f"too few tokens: |N|={n_neg}, |P|={n_pos}, min_tokens={min_tokens}"
    elif not neg_ref > 0:
        reason = "every negative-advantage token is clipped in BF16 at l0: rho_ref undefined"
    if reason:
        rho_prev = pos_mass(r_p, h_prev) / neg_mass(r_n, l_prev) if n_neg and n_pos else nan
        clip_prev = (r_n < l_prev).sum().to(f64) / n_neg if n_neg else nan
        stats = (alpha, rho_ref, rho_prev, clip_prev)
        a, rr, rp, cp = torch.stack([torch.as_tensor(x, dtype=f64) for x in stats]).tolist()
        return CalibrationResult(
            lower=l_prev, upper=h_prev, alpha=a, rho_ref=rr, rho=rp, lower_target=NAN,
            upper_target=NAN, updated=False, reason=reason, lower_clipfrac=cp,
            n_neg=n_neg, n_pos=n_pos,
        )

    # Step 2: L* = alpha-quantile of r over N, linear interpolation as torch.quantile.
    # With alpha = k / |N| (0 < k < |N|) the rank alpha (|N| - 1) lies strictly between
    # k - 1 and k, so L* falls in (s[k-1], s[k]] and clips exactly k tokens when values
    # are distinct; with r == rhat, exactly the tokens l0 clips, ties included.
    s_n, _ = torch.sort(r_n)
    rank = alpha * (n_neg - 1)
    below = rank.floor().long()
    above = (below + 1).clamp(max=n_neg - 1)
    l_star = torch.lerp(s_n[below], s_n[above], rank - below.to(f64))
    l_star = l_star.clamp(lower_min, LOWER_CEIL)

    # Step 4: H* = smallest H >= 1 with pos(r; H) >= rho_ref * neg(r; L*). pos(r; H) is a
    # step function: sort r over P, the first cumulative sum reaching the target names H*.
    s_p, order = torch.sort(r_p)
    prefix = torch.cat([s_p.new_zeros(1), torch.cumsum(a_p[order] * s_p, 0)])
    target = rho_ref * neg_mass(r_n, l_star)
    # k = how many of the sorted P tokens must be included (0: H = 1 already suffices,
    # n_pos + 1: no H reaches the target, H* = H_max).
    k = torch.searchsorted(prefix, (target - _REACH_RTOL * prefix[-1]).reshape(1)).squeeze(0)
    last_included = s_p[(k - 1).clamp(0, n_pos - 1)].clamp_min(1.0)
    h_star = torch.where(k == 0, torch.ones_like(last_included),
                         torch.where(k > n_pos, torch.full_like(last_included, h_max), last_included))
    h_star = h_star.clamp(UPPER_FLOOR, h_max)

    # Step 5: smoothing caps.
    l_t = l_star.clamp(l_prev - d_low, l_prev + d_low)
    h_t = h_star.clamp(h_prev - d_up, h_prev + d_up)

    rho = pos_mass(r_p, h_t) / neg_mass(r_n, l_t)
    rho_target = pos_mass(r_p, h_star) / neg_mass(r_n, l_star)
    clipfrac = (r_n < l_t).sum().to(f64) / n_neg
    vals = torch.stack([l_t, h_t, alpha, rho_ref, rho, l_star, h_star, rho_target, clipfrac]).tolist()
    lt, ht, a, rr, rho_v, ls, hs, rt, cf = vals
    return CalibrationResult(
        lower=lt, upper=ht, alpha=a, rho_ref=rr, rho=rho_v, lower_target=ls, upper_target=hs,
        updated=True, rho_target=rt, lower_clipfrac=cf, n_neg=n_neg, n_pos=n_pos,
    )


CALIBRATION_MODES = ("calibrate", "diagnose")


@dataclass
class CalibrationState:
    """The clip bounds a trainer uses, when it recalibrates them, and their history.

    mode="calibrate": update() adopts the new bounds. mode="diagnose": the bounds stay
    where they are (vanilla FP8 with nominal bounds) and the results are only recorded.
    Calibration steps are 0, interval, 2 interval, ...; new bounds apply from the next step.
    """

    lower: float
    upper: float
    nominal: tuple[float, float] | None = None
    interval: int = 20
    mode: str = "calibrate"
    history: list[dict] = field(default_factory=list)
    max_step: tuple[float, float] = (0.05, 0.1)
    min_tokens: int = 32
    upper_max: float | None = None
    lower_min: float = 0.05

    def __post_init__(self):
        self.lower, self.upper = check_bounds("bounds (lower, upper)", (self.lower, self.upper))
        if self.nominal is None:
            self.nominal = (self.lower, self.upper)
        self.nominal = check_bounds("nominal", self.nominal)
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
            raise ValueError(f"interval must be a positive int, got {self.interval!r}")
        if self.mode not in CALIBRATION_MODES:
            raise ValueError(f"unknown calibration mode {self.mode!r}; valid: {', '.join(CALIBRATION_MODES)}")
        self.max_step = _pair("max_step", self.max_step)

    @property
    def bounds(self) -> tuple[float, float]:
        return self.lower, self.upper

    def is_calibration_step(self, step: int) -> bool:
        return step >= 0 and step % self.interval == 0

    def calibrate(self, ratio, ratio_ref, advantages, mask, *, step: int | None = None) -> CalibrationResult:
        """calibrate_bounds with this state's bounds and settings, then update()."""
        result = calibrate_bounds(
            ratio, ratio_ref, advantages, mask, nominal=self.nominal, previous=self.bounds,
            max_step=self.max_step, min_tokens=self.min_tokens, upper_max=self.upper_max,
            lower_min=self.lower_min,
        )
        self.update(result, step=step)
        return result

    def update(self, result: CalibrationResult, *, step: int | None = None) -> None:
        if not isinstance(result, CalibrationResult):
            raise ValueError(f"result must be a CalibrationResult, got {type(result).__name__}")
        entry = result.as_dict()
        entry["step"] = step
        entry["mode"] = self.mode
        self.history.append(entry)
        if self.mode == "calibrate" and result.updated:
            self.lower, self.upper = result.lower, result.upper

    def state_dict(self) -> dict:
        """JSON-serialisable (lists, not tuples; no NaN)."""
        return {
            "lower": self.lower,
            "upper": self.upper,
            "nominal": list(self.nominal),
            "interval": self.interval,
            "mode": self.mode,
            "history": [dict(h) for h in self.history],
            "max_step": list(self.max_step),
            "min_tokens": self.min_tokens,
            "upper_max": self.upper_max,
            "lower_min": self.lower_min,
        }

    def load_state_dict(self, state: dict) -> None:
        names = [f.name for f in fields(self)]
        unknown = sorted(set(state) - set(names))
        missing = sorted({"lower", "upper", "nominal"} - set(state))
        if unknown or missing:
            raise ValueError(f"CalibrationState.load_state_dict: unknown keys {unknown}, missing keys {missing}")
        kwargs = {k: state[k] for k in names if k in state}
        kwargs["nominal"] = tuple(kwargs["nominal"])
        if "max_step" in kwargs:
            kwargs["max_step"] = tuple(kwargs["max_step"])
        kwargs["history"] = [dict(h) for h in kwargs.get("history", [])]
        fresh = CalibrationState(**kwargs)  # validates
        for name in names:
            setattr(self, name, getattr(fresh, name))
