"""The channel at every shadow step (issue 48, item 3): per FP8 arm and shadow step, the
per-token probability error, the high-entropy share of its lower clips, its lower clips
against the BF16 shadow's, the garble rate, and entropy and length of the step's
negative-advantage responses by clip decision.

The windowed verdict on the channel is matched.channel; this is the trajectory behind it, so a
reader can see whether the share rises late (the paper's surge) or sits near chance all along.
Metric rows are averaged over seeds (each seed one value a step); responses are pooled over
seeds, since one step of one seed holds only about eight negative responses.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..train.runlog import RESPONSES_FILE, read_metrics
from ..utils import save_figure
from .matched import HIGH
from .response_entropy import clip_flag, negative_responses
from .sweep.spec import run_dir
from .sweep.stats import summarize_seeds

GARBLE, NMAE = "rollout/malformed_frac", "shadow/nmae_prob"
LOWER_FP8, LOWER_BF16 = "shadow/lower_clipfrac_neg_fp8", "shadow/lower_clipfrac_neg_bf16"
METRICS = (HIGH, LOWER_FP8, LOWER_BF16, GARBLE, NMAE)
PAPER_SHARE, TOY_SHARE = 0.9, 0.2  # the paper's ~90 %; the toy's ~0.2 (docs/study-matched.md)


def _shadow_steps(by_seed: dict[int, list[dict]], skip_steps: int) -> list[int]:
    """The steps at which every seed logged a shadow pass (the HIGH key, finite or not)."""
    per_seed = [{r["step"] for r in rows if HIGH in r} for rows in by_seed.values()]
    common = set.intersection(*per_seed) if per_seed else set()
    return sorted(s for s in common if s >= skip_steps)


def _pooled(neg: list[dict], flag: str) -> dict:
    """Mean entropy and length of negative responses by clip decision, and their counts."""

    def mean(key, clipped):
        xs = [r[key] for r in neg if bool(r.get(flag)) is clipped and key in r]
        return math.fsum(xs) / len(xs) if xs else None

    n_clipped = sum(bool(r.get(flag)) for r in neg)
    return {
        "n_clipped": n_clipped,
        "n_unclipped": len(neg) - n_clipped,
        "entropy_clipped": mean("entropy", True),
        "entropy_unclipped": mean("entropy", False),
        "length_clipped": mean("length", True),
        "length_unclipped": mean("length", False),
    }


def channel_by_step(out_dir, spec, runs: dict, arms: list[str]) -> dict:
    """{arm: [{"step", METRIC: STATS over seeds, "responses": pooled by-clip stats}]} for each
    of `arms` that logged shadow passes; a step's metric with no finite value has mean None."""
    result = {}
    for arm in arms:
        by_seed = runs[arm]
        steps = _shadow_steps(by_seed, spec.skip_steps)
        if not steps:
            continue
        rows_at = {s: {r["step"]: r for r in rows} for s, rows in by_seed.items()}
        folders = {s: run_dir(Path(out_dir), arm, s) for s in sorted(by_seed)}
        flag = clip_flag(next(iter(folders.values())))  # the BF16 shadow's under oracle clipping
        neg_at = defaultdict(list)  # step -> the seeds' negative responses, in seed order
        for d in folders.values():
            for r in negative_responses(read_metrics(d, name=RESPONSES_FILE, quiet=True), 0):
                neg_at[r["step"]].append(r)
        table = []
        for step in steps:
            entry: dict = {"step": step}
            for key in METRICS:
                entry[key] = summarize_seeds([rows_at[s][step].get(key) for s in sorted(by_seed)])
            entry["responses"] = _pooled(neg_at[step], flag)
            table.append(entry)
        result[arm] = table
    return result


def _pct(x):
    return None if x is None else 100.0 * x


def _cell(x, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def channel_by_step_md(by_step: dict) -> str:
    """One table per arm, a row per shadow step (means over seeds; responses pooled)."""
    parts = []
    for arm, table in by_step.items():
        lines = [
            f"`{arm}`:",
            "",
            "| step | per-token prob. error (NMAE) | high-entropy share of lower clips "
            "| lower clips / neg. tokens, FP8 | the same, BF16 shadow | garble rate "
            "| entropy clipped / not | length clipped / not | neg. responses clipped / not |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for e in table:
            r = e["responses"]
            lines.append(
                f"| {e['step']} | {_cell(_pct(e[NMAE]['mean']), 1)} % "
                f"| {_cell(e[HIGH]['mean'], 2)} (n={e[HIGH]['n']}) "
                f"| {_cell(e[LOWER_FP8]['mean'], 3)} | {_cell(e[LOWER_BF16]['mean'], 3)} "
                f"| {_cell(e[GARBLE]['mean'], 3)} "
                f"| {_cell(r['entropy_clipped'], 2)} / {_cell(r['entropy_unclipped'], 2)} "
                f"| {_cell(r['length_clipped'], 1)} / {_cell(r['length_unclipped'], 1)} "
                f"| {r['n_clipped']} / {r['n_unclipped']} |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _nan(x) -> float:
    return math.nan if x is None else x


def plot_channel_by_step(path, by_step: dict) -> Path:
    """Four panels over the shadow steps: the high-entropy share (with the paper's, the toy's
    and chance), lower clips FP8 against BF16, the garble rate, entropy by clip decision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    ax_share, ax_low, ax_garble, ax_ent = axes.flat
    for arm, table in by_step.items():
        steps = [e["step"] for e in table]
        share = [_nan(e[HIGH]["mean"]) for e in table]
        err = [_nan(e[HIGH]["se"]) for e in table]
        ax_share.errorbar(steps, share, yerr=err, marker="o", ms=3, capsize=2, label=arm)
        (line,) = ax_low.plot(steps, [_nan(e[LOWER_FP8]["mean"]) for e in table], "-o", ms=3)
        line.set_label(f"{arm}: FP8 ratio")
        ax_low.plot(
            steps,
            [_nan(e[LOWER_BF16]["mean"]) for e in table],
            "--",
            color=line.get_color(),
            label=f"{arm}: BF16 shadow",
        )
        ax_garble.plot(steps, [_nan(e[GARBLE]["mean"]) for e in table], "-o", ms=3, label=arm)
        resp = [e["responses"] for e in table]
        (line,) = ax_ent.plot(steps, [_nan(r["entropy_clipped"]) for r in resp], "-o", ms=3)
        line.set_label(f"{arm}: lower-clipped")
        ax_ent.plot(
            steps,
            [_nan(r["entropy_unclipped"]) for r in resp],
            "--",
            color=line.get_color(),
            label=f"{arm}: not clipped",
        )
    for y, label in ((PAPER_SHARE, "paper ~0.9"), (TOY_SHARE, "toy ~0.2"), (0.1, "chance 0.1")):
        ax_share.axhline(y, color="grey", lw=0.8, ls=":")
        ax_share.text(
            0.99,
            y,
            label,
            transform=ax_share.get_yaxis_transform(),
            ha="right",
            va="bottom",
            fontsize=7,
            color="grey",
        )
    ax_share.set_ylim(0, 1)
    titles = (
        "high-entropy share of lower clips (mean +- SE over seeds)",
        "lower clips / negative-advantage tokens",
        "garble rate at the shadow steps",
        "mean entropy of negative responses (nats/token), seeds pooled",
    )
    for ax, title in zip(axes.flat, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return Path(path)
