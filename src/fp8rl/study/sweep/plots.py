"""Plots and the headline table of a sweep. A plot draws, per arm and metric, the mean over
seeds at each step and a band of +- 1 standard error over seeds (no band with one seed)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from ...train.runlog import read_metrics
from ...utils import save_figure
from ..report import PLOTS
from .spec import SweepSpec, load_spec, run_dir
from .stats import finite

# (file name, title, y label, [(metric key, legend suffix)], leave out step 0)
PlotSpec = tuple[str, str, str, list[tuple[str, str]], bool]

DEFAULT_PLOTS: list[PlotSpec] = PLOTS  # the same plots as `fp8rl report`, with bands
LINE_STYLES = ("-", "--", ":", "-.")


def _arm_seeds(agg_or_spec) -> dict[str, list[int]]:
    # an aggregate's arms carry "metrics"; anything else is read as a spec
    if isinstance(agg_or_spec, Mapping) and isinstance(agg_or_spec.get("arms"), Mapping):
        arms = agg_or_spec["arms"]
        if arms and all(isinstance(a, Mapping) and "metrics" in a for a in arms.values()):
            return {name: list(a["seeds"]) for name, a in arms.items()}
    spec: SweepSpec = load_spec(agg_or_spec)
    return {arm: list(spec.seeds) for arm in spec.arms}


def band(
    runs: list[list[dict]], key: str, skip_step0: bool
) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean over seeds, SE over seeds; NaN where fewer than two seeds have a value)."""
    by_step: dict[int, list[float]] = {}
    for rows in runs:
        for r in rows:
            v = finite(r.get(key))
            if v is not None and not (skip_step0 and r.get("step") == 0):
                by_step.setdefault(int(r["step"]), []).append(v)
    steps = sorted(by_step)
    means, ses = [], []
    for s in steps:
        vs = by_step[s]
        m = sum(vs) / len(vs)
        means.append(m)
        n = len(vs)
        ses.append(math.sqrt(sum((v - m) ** 2 for v in vs) / (n - 1) / n) if n > 1 else math.nan)
    return steps, means, ses


def plot_sweep(out_dir, agg_or_spec, plots: list[PlotSpec] | None = None) -> list[Path]:
    """One PNG per plot spec in `plots` (default DEFAULT_PLOTS) into `out_dir`, from the run
    folders OUT/ARM/seed-S; `agg_or_spec` (aggregate() result, spec path, dict or SweepSpec)
    names the arms and seeds. Metrics an arm lacks are skipped; a plot with no data at all
    is not written. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    arms = _arm_seeds(agg_or_spec)
    runs = {arm: [read_metrics(run_dir(out, arm, s)) for s in seeds] for arm, seeds in arms.items()}
    written = []
    for fname, title, ylabel, keys, skip0 in plots or DEFAULT_PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = False
        for ci, (arm, arm_runs) in enumerate(runs.items()):
            for li, (key, suffix) in enumerate(keys):
                steps, means, ses = band(arm_runs, key, skip0)
                if not steps:
                    continue
                color, drawn = f"C{ci % 10}", True
                ax.plot(
                    steps,
                    means,
                    color=color,
                    linestyle=LINE_STYLES[li % len(LINE_STYLES)],
                    marker="o" if len(steps) < 12 else None,
                    markersize=3,
                    label=f"{arm}: {suffix}" if suffix else arm,
                )
                if not all(math.isnan(s) for s in ses):
                    ax.fill_between(
                        steps,
                        [m - s for m, s in zip(means, ses, strict=True)],
                        [m + s for m, s in zip(means, ses, strict=True)],
                        color=color,
                        alpha=0.2,
                        linewidth=0,
                    )
        if drawn:
            ax.set_title(f"{title}\nmean over seeds, band: +- 1 SE", fontsize=10)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            save_figure(fig, out / fname, dpi=110)
            written.append(out / fname)
        plt.close(fig)
    return written


# (column, where in an arm's aggregate, key)
HEADLINE = [
    ("reward_final", "final", "reward_final"),
    ("eval_final_mean@1", "final", "eval_final_mean@1"),
    ("rollout/entropy", "metrics", "rollout/entropy"),
    ("shadow/lower_clipfrac_neg_fp8", "metrics", "shadow/lower_clipfrac_neg_fp8"),
    ("shadow/lower_clipfrac_neg_bf16", "metrics", "shadow/lower_clipfrac_neg_bf16"),
]


def mean_se(stats: Mapping | None) -> str:
    """ "0.512 ± 0.031" ("-" without a mean, no SE with one seed)."""
    if not stats or stats.get("mean") is None:
        return "-"
    se = stats.get("se")
    return f"{stats['mean']:.4g}" + (f" ± {se:.2g}" if se is not None else "")


def summary_table(agg: Mapping) -> str:
    """A markdown table, one row per arm, of the headline metrics as mean ± SE over seeds;
    columns no arm has are left out."""
    arms = agg["arms"]
    cols = [c for c in HEADLINE if any(c[2] in a[c[1]] for a in arms.values())]
    lines = [
        "| arm | seeds | " + " | ".join(c[0] for c in cols) + " |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for name, a in arms.items():
        cells = [mean_se(a[where].get(key)) for _, where, key in cols]
        lines.append(f"| {name} | {len(a['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
