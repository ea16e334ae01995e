"""`fp8rl report`: PNG plots of several runs overlaid, a markdown table and summary numbers."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import Fp8rlError, os_errors
from ..train.runlog import METRICS_FILE, numbered_rows, warn
from ..utils import atomic_write_text, json_safe, save_figure

# (file name, title, y label, [(metric, legend suffix)], leave out step 0). Step 0 is Adam's
# first update, which clips ~10 % of tokens in any precision: it would dwarf the clip plots.
PLOTS = [
    ("reward.png", "rollout reward", "mean reward", [("rollout/reward", "")], False),
    (
        "entropy.png",
        "mean token entropy (rollout)",
        "entropy (nats)",
        [("rollout/entropy", "")],
        False,
    ),
    (
        "response_len.png",
        "response length (rollout)",
        "tokens",
        [("rollout/response_len", "")],
        False,
    ),
    (
        "clipfrac_lower_neg.png",
        "lower-bound clips of negative-advantage tokens",
        "fraction of tokens",
        [("actor/clipfrac_lower_neg", "")],
        True,
    ),
    (
        "clipfrac_upper_pos.png",
        "upper-bound clips of positive-advantage tokens",
        "fraction of tokens",
        [("actor/clipfrac_upper_pos", "")],
        True,
    ),
    (
        "shadow_lower_clip.png",
        "lower clips of N at shadow steps",
        "fraction of N",
        [
            ("shadow/lower_clipfrac_neg_fp8", "FP8 ratios"),
            ("shadow/lower_clipfrac_neg_bf16", "BF16 shadow"),
        ],
        True,
    ),
    (
        "shadow_lower_clip_excess.png",
        "excess lower clips of N (FP8 ratios - BF16 shadow)",
        "fraction of N",
        [("shadow/lower_clip_excess", "")],
        True,
    ),
    (
        "bounds.png",
        "clip bounds each step's loss used",
        "bound",
        [("calib/lower", "L"), ("calib/upper", "H")],
        False,
    ),
    (
        "nmae.png",
        "shadow NMAE",
        "NMAE",
        [("shadow/nmae_prob", "probability"), ("shadow/nmae_ratio", "ratio")],
        False,
    ),
    (
        "amplification.png",
        "ratio-noise amplification (mean |r/rhat - 1| / mean |p/phat - 1|)",
        "amplification",
        [("shadow/amplification", "")],
        False,
    ),
    (
        "tis_weight.png",
        "mean TIS weight (rollout vs trainer)",
        "TIS weight",
        [("actor/tis_weight_mean", "")],
        False,
    ),
]

SUMMARY_KEYS = {
    "entropy_mean": "rollout/entropy",
    "clipfrac_lower_neg_mean": "actor/clipfrac_lower_neg",
    "clipfrac_upper_pos_mean": "actor/clipfrac_upper_pos",
    "shadow_clipfrac_bf16_mean": "shadow/clipfrac_bf16",
    "shadow_clipfrac_fp8_mean": "shadow/clipfrac_fp8",
    "shadow_lower_clipfrac_neg_fp8_mean": "shadow/lower_clipfrac_neg_fp8",
    "shadow_lower_clipfrac_neg_bf16_mean": "shadow/lower_clipfrac_neg_bf16",
    "shadow_false_lower_clip_mean": "shadow/false_lower_clip",
    "shadow_nmae_prob_mean": "shadow/nmae_prob",
    "shadow_nmae_ratio_mean": "shadow/nmae_ratio",
    "shadow_amplification_mean": "shadow/amplification",
    "shadow_nmae_quotient_mean": "shadow/nmae_quotient",
    "shadow_lower_clip_excess_mean": "shadow/lower_clip_excess",
    "tis_weight_mean": "actor/tis_weight_mean",
    "kl_rollout_train_mean": "mismatch/kl_rollout_train",
}


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict], *, final_window: int = 10) -> dict:
    """Means over the run; `reward_final` is the mean rollout reward of the last steps."""
    _, rewards = _series(rows, "rollout/reward")
    out = {
        "steps": len(rows),
        "reward_final": _mean(rewards[-final_window:]),
        "reward_first": _mean(rewards[:final_window]),
        "wall_s": sum(_series(rows, "time/wall_step")[1]),
    }
    for name, key in SUMMARY_KEYS.items():
        out[name] = _mean(_series(rows, key)[1])
    surges = [r["step"] for r in rows if r.get("rollout/entropy_surge")]
    out["entropy_surge_steps"] = surges
    evals = {k: v for r in rows for k, v in r.items() if k.startswith("eval/")}
    out.update({k.replace("eval/", "eval_"): v for k, v in evals.items()})
    return out


def plot_runs(runs: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for fname, title, ylabel, keys, skip0 in PLOTS:
        # the series as plotted (step 0 left out where it says nothing): a run of one step
        # has none there, and an empty plot or legend is no plot (and a matplotlib warning)
        shown = {
            name: [r for r in rows if not (skip0 and r["step"] == 0)] for name, rows in runs.items()
        }
        if not any(_series(rows, k)[0] for rows in shown.values() for k, _ in keys):
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for ci, (name, rows) in enumerate(shown.items()):
            for li, (key, suffix) in enumerate(keys):
                xs, ys = _series(rows, key)
                if xs:
                    marker = "o" if len(xs) < 12 else None
                    ax.plot(
                        xs,
                        ys,
                        color=f"C{ci}",
                        linestyle="-" if li == 0 else "--",
                        marker=marker,
                        markersize=3,
                        label=f"{name}: {suffix}" if suffix else name,
                    )
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / fname
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return str(len(v))
    return str(v)


def markdown_table(summaries: dict[str, dict]) -> str:
    cols = [
        "reward_first",
        "reward_final",
        "entropy_mean",
        "clipfrac_lower_neg_mean",
        "shadow_lower_clipfrac_neg_fp8_mean",
        "shadow_lower_clipfrac_neg_bf16_mean",
        "shadow_clipfrac_fp8_mean",
        "shadow_clipfrac_bf16_mean",
        "shadow_nmae_prob_mean",
        "shadow_amplification_mean",
        "steps",
        "wall_s",
    ]
    extra = sorted({k for s in summaries.values() for k in s if k.startswith("eval_")})
    cols += extra
    lines = ["| run | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, s in summaries.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(s.get(c)) for c in cols) + " |")
    return "\n".join(lines)


# the keys summarize and plot_runs read as numbers (and every eval/ key): a string there is damage
NUMERIC = {k for *_, keys, _ in PLOTS for k, _ in keys} | set(SUMMARY_KEYS.values())
NUMERIC |= {"rollout/reward", "rollout/entropy_surge", "time/wall_step"}


def _row_problem(row: dict) -> str | None:
    """Why `row` is not what MetricsLog.write writes (a number, null, or a string where no
    number is read, per key); None when it is."""
    if not 0 <= row["step"] < 2**53:  # steps are plotted as floats
        return "step is negative or not below 2^53"
    for key, v in row.items():
        if key == "step" or v is None:
            continue
        if isinstance(v, str) and key not in NUMERIC and not key.startswith("eval/"):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{key} is {_kind(v)}, not a number or null"
        try:
            float(v)
        except OverflowError:
            return f"{key} is an integer too large for a float"
    return None


def _kind(v) -> str:
    if isinstance(v, str):
        return f"the string {v[:30]!r}"
    if isinstance(v, bool):
        return json.dumps(v)
    return {list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def read_rows(run_dir: str | Path) -> list[dict]:
    """The rows of RUN/metrics.jsonl for a report. A row of the wrong types is skipped with a
    warning naming the file and line, like a corrupt line (the rest of the run still holds);
    a step that does not increase is an error: the file then holds two runs (or a resume went
    wrong), and no row is the right one to keep."""
    path = Path(run_dir) / METRICS_FILE
    rows, last = [], None
    for number, row in numbered_rows(path):
        problem = _row_problem(row)
        if problem:
            warn(f"{path} line {number} is not a metrics row ({problem}): skipped")
            continue
        if last is not None and row["step"] <= last[1]:
            raise Fp8rlError(
                f"{path} line {number}: step {row['step']} after step {last[1]} (line {last[0]}):"
                " steps must increase; two runs wrote to this file or a resume went wrong"
            )
        last = number, row["step"]
        rows.append(row)
    if not rows:
        raise Fp8rlError(f"run folder {run_dir} has no {METRICS_FILE} rows")
    return rows


def run_names(run_dirs: list[str | Path]) -> list[str]:
    """Each run folder's path below the common parent of all (one run: its base name), so two
    runs never share a name; one folder given twice is an error."""
    paths = [Path(os.path.abspath(d)) for d in run_dirs]
    for j, p in enumerate(paths):
        if p in paths[:j]:
            i = paths.index(p)
            raise Fp8rlError(
                f"run folder {run_dirs[i]} is given twice (also as {run_dirs[j]}): name each once"
            )
    if len(paths) == 1:
        return [paths[0].name]
    common = Path(os.path.commonpath([p.parent for p in paths]))
    return [p.relative_to(common).as_posix() for p in paths]


def make_report(
    run_dirs: list[str | Path], out_dir: str | Path, names: list[str] | None = None
) -> dict:
    """report.md, report.json and PNG plots of `run_dirs` in `out_dir`; the runs are named
    `names`, or by `run_names`. Every input is read and checked before anything is written."""
    if names is None:
        names = run_names(run_dirs)
    elif len(names) != len(run_dirs) or len(set(names)) != len(names):
        raise Fp8rlError(f"report names {names!r}: one distinct name per run folder")
    runs = {name: read_rows(d) for name, d in zip(names, run_dirs, strict=True)}
    out = Path(out_dir)
    with os_errors("create the report folder", out):  # after the inputs are checked
        out.mkdir(parents=True, exist_ok=True)
    summaries = json_safe({name: summarize(rows) for name, rows in runs.items()})
    plots = plot_runs(runs, out)
    table = markdown_table(summaries)
    atomic_write_text(
        out / "report.md",
        "# fp8rl report\n\n"
        + table
        + "\n\n"
        + "\n".join(f"![{p.stem}]({p.name})" for p in plots)
        + "\n",
    )
    atomic_write_text(out / "report.json", json.dumps(summaries, indent=1, allow_nan=False))
    return {"summaries": summaries, "plots": [str(p) for p in plots], "table": table}
