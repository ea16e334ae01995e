"""Statistics over seeds for `fp8rl sweep`: mean, standard error and a Student-t 95 % interval.

scipy is not a dependency, so the t quantile comes from the regularized incomplete beta
function (continued fraction, as in Numerical Recipes) and bisection on the t CDF.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ...utils import atomic_write_text, json_safe


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t (bisection on `t_cdf`, to about 1e-12)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: p={p} must be in (0, 1) and df={df} positive")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def t_test_power(effect: float, n: int, alpha: float = 0.05, points: int = 2000) -> float:
    """Power of the two-sided one-sample (or seed-paired) t test at level `alpha` on n values
    whose true mean is `effect` standard deviations from 0: P(|T| > t_{1-alpha/2, n-1}), T the
    noncentral t (noncentrality effect * sqrt(n)). Exact up to the quadrature: T = (Z + lam) / S
    with S = sqrt(chi2_df / df), so the power is the mean over S's density of
    Phi(lam - c S) + Phi(-lam - c S), integrated by Simpson's rule."""
    if n < 2:
        raise ValueError(f"t_test_power: n={n}, a t test needs at least 2 values")
    df = n - 1
    c, lam = t_quantile(1.0 - alpha / 2.0, df), effect * math.sqrt(n)
    log_const = math.log(2.0 * df) - (df / 2.0) * math.log(2.0) - math.lgamma(df / 2.0)

    def integrand(s: float) -> float:
        if df > 1 and s <= 0.0:
            return 0.0  # S's density is s^(df-1) near 0: positive there only for df = 1
        log_s = (df - 1) * math.log(s) if df > 1 else 0.0
        log_density = log_const + log_s + (df / 2.0 - 1.0) * math.log(df)
        density = math.exp(log_density - df * s * s / 2.0)
        return density * (_normal_cdf(lam - c * s) + _normal_cdf(-lam - c * s))

    top = 1.0 + 12.0 / math.sqrt(df)  # S's sd is about 1/sqrt(2 df): the rest is < 1e-12
    h = top / points
    total = integrand(0.0) + integrand(top)
    total += sum((4.0 if i % 2 else 2.0) * integrand(i * h) for i in range(1, points))
    return total * h / 3.0


def detectable_effect(n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean, in standard deviations, that the two-sided t test on n values
    finds with probability `power` (bisection on `t_test_power`)."""
    if not alpha < power < 1.0:
        raise ValueError(f"detectable_effect: power={power} must lie in (alpha={alpha}, 1)")
    lo, hi = 0.0, 1.0
    while t_test_power(hi, n, alpha) < power:
        lo, hi = hi, hi * 2.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_test_power(mid, n, alpha) < power else (lo, mid)
    return 0.5 * (lo + hi)


def finite(value) -> float | None:
    """A finite float, or None for None, NaN, infinities, booleans and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def summarize_seeds(per_seed: Sequence[float | None]) -> dict:
    """{"mean", "se", "ci95", "n", "per_seed"} over the finite entries of `per_seed`.

    se is the sample standard deviation (ddof=1) over sqrt(n); ci95 is mean -+ t*se with t the
    0.975 quantile of Student's t with n-1 degrees of freedom. se and ci95 are None for n < 2,
    the mean is None for n = 0. None entries (a seed without the metric) are kept in per_seed."""
    values = [v for v in (finite(x) for x in per_seed) if v is not None]
    n = len(values)
    out = {
        "mean": None,
        "se": None,
        "ci95": None,
        "n": n,
        "per_seed": [finite(x) for x in per_seed],
    }
    if n == 0:
        return out
    mean = math.fsum(values) / n
    out["mean"] = mean
    if n >= 2:
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        se = math.sqrt(var / n)
        t = t_quantile(0.975, n - 1)
        out.update(se=se, ci95=[mean - t * se, mean + t * se])
    return out


def seed_mean(rows: Iterable[Mapping], key: str, skip_steps: int = 1) -> float | None:
    """Mean of `key` over the rows with step >= skip_steps where it is finite; None if none are."""
    values = [
        v
        for r in rows
        if r.get("step", 0) >= skip_steps
        for v in (finite(r.get(key)),)
        if v is not None
    ]
    return math.fsum(values) / len(values) if values else None


def _per_seed_rows(runs) -> list[list[Mapping]]:
    if isinstance(runs, Mapping):
        return [list(rows) for rows in runs.values()]
    return [list(rows) for rows in runs]


def paired(runs, key_a: str, key_b: str, *, skip_steps: int = 1) -> dict:
    """Paired difference a - b: per seed the mean over steps >= skip_steps of (a - b) row by row,
    using only the rows where both are finite; then `summarize_seeds` over the seeds.

    `runs` holds one list of metric rows per seed: a mapping seed -> rows (as `load_runs`
    returns per arm) or a plain list of row lists. Used for the FP8 vs BF16-shadow lower clip
    fractions, which a run logs in the same row."""
    per_seed = []
    for rows in _per_seed_rows(runs):
        diffs = [
            a - b
            for r in rows
            if r.get("step", 0) >= skip_steps
            for a, b in ((finite(r.get(key_a)), finite(r.get(key_b))),)
            if a is not None and b is not None
        ]
        per_seed.append(math.fsum(diffs) / len(diffs) if diffs else None)
    return summarize_seeds(per_seed)


def fieller_ratio(num: Sequence[float], den: Sequence[float], level: float = 0.95) -> dict:
    """The ratio of seed-paired means mean(num) / mean(den) with its Fieller interval: the R
    for which mean(num - R den) = 0 is not rejected by a two-sided t test (n-1 d.f.). The
    interval is bounded only when mean(den) differs from 0 at that level (else "ci" is None);
    it need not be symmetric about the ratio. Pairs with a non-finite member are an error."""
    pairs = [(finite(a), finite(b)) for a, b in zip(num, den, strict=True)]
    if any(a is None or b is None for a, b in pairs) or len(pairs) < 2:
        raise ValueError(f"fieller_ratio needs >= 2 finite pairs, got {num!r} / {den!r}")
    n = len(pairs)
    mx = math.fsum(a for a, _ in pairs) / n
    my = math.fsum(b for _, b in pairs) / n
    sxx = math.fsum((a - mx) ** 2 for a, _ in pairs) / (n - 1) / n
    syy = math.fsum((b - my) ** 2 for _, b in pairs) / (n - 1) / n
    sxy = math.fsum((a - mx) * (b - my) for a, b in pairs) / (n - 1) / n
    t2 = t_quantile(0.5 + level / 2, n - 1) ** 2
    out = {"ratio": mx / my if my else None, "ci": None, "n": n, "mean_num": mx, "mean_den": my}
    a = my * my - t2 * syy  # > 0: the denominator's mean is away from 0 at this level
    b = mx * my - t2 * sxy
    c = mx * mx - t2 * sxx
    if a > 0:
        root = math.sqrt(max(b * b - a * c, 0.0))  # >= 0 whenever a > 0 (Cauchy-Schwarz)
        out["ci"] = [(b - root) / a, (b + root) / a]
    return out


def fisher_exact(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test for hits_a of n_a against hits_b of n_b: the total
    probability, under fixed margins, of the tables no more likely than the one observed."""
    if not (0 <= hits_a <= n_a and 0 <= hits_b <= n_b) or n_a + n_b == 0:
        raise ValueError(f"fisher_exact: counts {hits_a}/{n_a}, {hits_b}/{n_b}")
    hits, n = hits_a + hits_b, n_a + n_b

    def prob(k: int) -> float:  # hypergeometric: k of the hits in the first group
        return math.comb(n_a, k) * math.comb(n_b, hits - k) / math.comb(n, hits)

    seen = prob(hits_a)
    ks = range(max(0, hits - n_b), min(hits, n_a) + 1)
    return min(1.0, math.fsum(p for p in map(prob, ks) if p <= seen * (1 + 1e-9)))


def write_json(path: Path, data) -> None:
    """Atomic JSON write (utils.atomic_write_text); NaN and infinities become null."""
    atomic_write_text(path, json.dumps(json_safe(data), indent=1, allow_nan=False))


def write_report(folder: Path, stem: str, data, text: str) -> None:
    """A study tool's two outputs: FOLDER/STEM.json (the numbers) and FOLDER/STEM.md (`text`)."""
    write_json(Path(folder) / f"{stem}.json", data)
    atomic_write_text(Path(folder) / f"{stem}.md", text + "\n")
