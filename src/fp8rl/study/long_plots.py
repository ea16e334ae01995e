"""The long-horizon study's plots (study/long_verdict.py writes them): trajectories of every
arm with a band of +- 1 SE over seeds, and the calibrated clip bounds over the run."""

from __future__ import annotations

import math
from pathlib import Path

from ..utils import save_figure
from .sweep.stats import summarize_seeds


def _smooth(xs: list[float], k: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - k + 1) : i + 1] if math.isfinite(x)]
        out.append(sum(win) / len(win) if win else math.nan)
    return out


def _mean_band(series: list[list[float]]) -> tuple[list[float], list[float]]:
    n = min(len(s) for s in series)
    means, ses = [], []
    for i in range(n):
        vs = [s[i] for s in series if math.isfinite(s[i])]
        m = sum(vs) / len(vs) if vs else math.nan
        sd = math.sqrt(sum((v - m) ** 2 for v in vs) / (len(vs) - 1)) if len(vs) > 1 else math.nan
        means.append(m)
        ses.append(sd / math.sqrt(len(vs)) if vs else math.nan)
    return means, ses


def _draw_band(ax, means: list[float], ses: list[float], style: str, label: str) -> None:
    """A mean line and its +- 1 SE band (no band where the SE is undefined)."""
    steps = list(range(len(means)))
    (line,) = ax.plot(steps, means, style, label=label, lw=1.2)
    lo = [a - b if math.isfinite(b) else a for a, b in zip(means, ses, strict=True)]
    hi = [a + b if math.isfinite(b) else a for a, b in zip(means, ses, strict=True)]
    ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


PANELS = (  # (metric, title, trailing-mean window)
    ("rollout/entropy", "rollout entropy (nats/token)", 1),
    ("rollout/reward", "reward (10-step trailing mean)", 10),
    ("rollout/malformed_frac", "garble rate (10-step trailing mean)", 10),
    ("rollout/response_len", "response length (tokens)", 1),
)


def _series(rows: list[dict], key: str) -> list[float]:
    rows = sorted(rows, key=lambda r: r["step"])
    return [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in rows]


def plot_trajectories(path, runs: dict, arms: list[str]) -> Path:
    """A 2 x 2 figure of PANELS: per arm the mean over seeds and a +- 1 SE band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (key, title, k) in zip(axes.flat, PANELS, strict=True):
        for arm in arms:
            series = [_smooth(_series(rows, key), k) for rows in runs[arm].values()]
            m, se = _mean_band(series)
            _draw_band(ax, m, se, "-", arm)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return Path(path)


def bounds_summary(runs: dict) -> dict:
    """Per arm that moves its bounds (calib/lower or calib/upper off their step-0 values): the
    range of each bound over all steps and seeds, and its last-step value (STATS over seeds)."""
    out = {}
    for arm, by_seed in runs.items():
        lows = [_series(rows, "calib/lower") for rows in by_seed.values()]
        highs = [_series(rows, "calib/upper") for rows in by_seed.values()]
        flat = [v for s in lows + highs for v in s if math.isfinite(v)]
        if not flat or len({round(v, 12) for v in flat}) <= 2:
            continue
        fin = [v for s in lows for v in s if math.isfinite(v)]
        fin_h = [v for s in highs for v in s if math.isfinite(v)]
        out[arm] = {
            "lower_min": min(fin),
            "lower_max": max(fin),
            "upper_min": min(fin_h),
            "upper_max": max(fin_h),
            "lower_last": summarize_seeds([s[-1] for s in lows]),
            "upper_last": summarize_seeds([s[-1] for s in highs]),
        }
    return out


def plot_bounds(path, runs: dict, arms: list[str]) -> Path:
    """The calibrated bounds over the run: per arm the mean over seeds with a +- 1 SE band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for arm in arms:
        for key, style in (("calib/lower", "-"), ("calib/upper", "--")):
            m, se = _mean_band([_series(rows, key) for rows in runs[arm].values()])
            _draw_band(ax, m, se, style, f"{arm} {key.split('/')[1]}")
    ax.axhline(0.8, color="grey", lw=0.8)
    ax.axhline(1.2, color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("clip bound of the ratio")
    ax.set_title("calibrated clip bounds (grey: nominal 0.8 / 1.2)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return Path(path)
