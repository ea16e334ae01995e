"""Response entropy with and without lower clips, from the runs' RUN/responses.jsonl
(`log.response_stats: true`): is a lower-clipped negative response a garbled, high-entropy one?

    python -m fp8rl.study.response_entropy runs/study      # table on stdout, PNG in the folder

Only negative-advantage responses can be lower-clipped, so both groups are negative ones; step
0 is left out (Adam's first update clips more than any later step). Per seed, the mean entropy
of each group and the share of lower-clipped responses among the top 10 % by entropy; then the
mean and standard error over seeds.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ..errors import DataError, Fp8rlError, one_line
from ..train.runlog import RESPONSES_FILE, read_metrics, readable_jsonl
from ..utils import run_main, save_figure
from .run_checks import IncompleteRunsError, complete_runs, read_json
from .sweep.spec import SPEC_FILE, load_spec, run_dir
from .sweep.stats import summarize_seeds


def clip_flag(run: Path) -> str:
    """The clip flag of the decision the run's loss made: the BF16 shadow's under oracle
    clipping (loss.clip_source=bf16), else the ratio it trained on (FP8, noised or BF16)."""
    loss = read_json(run / "config.json").get("loss")
    if not isinstance(loss, dict):
        raise DataError(f"{run / 'config.json'}: no loss section ({loss!r})")
    return "lower_clip_bf16" if loss.get("clip_source") == "bf16" else "lower_clip_fp8"


def _seed_dirs(out: Path) -> dict[str, dict[int, Path]]:
    """{arm: {seed: run folder}}: a sweep's every run (each finished, study/run_checks.py, and
    logging responses), else the folders under OUT that hold a responses file."""
    if (out / SPEC_FILE).is_file():
        spec = load_spec(out / SPEC_FILE)
        complete_runs(out, spec, ())
        for arm, seed in spec.runs():
            if readable_jsonl(run_dir(out, arm, seed) / RESPONSES_FILE) is None:
                raise IncompleteRunsError(
                    f"{run_dir(out, arm, seed)}: no {RESPONSES_FILE} (log.response_stats: true)"
                )
        return {arm: {s: run_dir(out, arm, s) for s in spec.seeds} for arm in spec.arms}
    runs: dict[str, dict[int, Path]] = {}
    # a committed study keeps RESPONSES_FILE gzipped (runlog reads either)
    found = set(out.glob(f"*/seed-*/{RESPONSES_FILE}")) | set(
        out.glob(f"*/seed-*/{RESPONSES_FILE}.gz")
    )
    for f in sorted(found):
        arm, seed = f.parent.parent.name, int(f.parent.name.split("-", 1)[1])
        runs.setdefault(arm, {})[seed] = f.parent
    return runs


def negative_responses(rows: list[dict], skip_steps: int) -> list[dict]:
    def adv(r):
        a = r.get("adv")
        return a if isinstance(a, (int, float)) and not isinstance(a, bool) else math.nan

    return [r for r in rows if r["step"] >= skip_steps and adv(r) < 0]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def seed_stats(rows: list[dict], flag: str, skip_steps: int = 1) -> dict:
    neg = negative_responses(rows, skip_steps)
    clipped = [r for r in neg if r[flag]]
    kept = [r for r in neg if not r[flag]]
    top = sorted(neg, key=lambda r: r["entropy"], reverse=True)[: max(len(neg) // 10, 1)]
    return {
        "n_clipped": len(clipped),
        "n_unclipped": len(kept),
        "entropy_clipped": _mean([r["entropy"] for r in clipped]),
        "entropy_unclipped": _mean([r["entropy"] for r in kept]),
        "length_clipped": _mean([r["length"] for r in clipped if "length" in r]),
        "length_unclipped": _mean([r["length"] for r in kept if "length" in r]),
        "clipped_share": len(clipped) / len(neg) if neg else math.nan,
        "top10_clipped_share": _mean([float(r[flag]) for r in top]) if neg else math.nan,
    }


def _checked_stats(run: Path, flag: str, skip_steps: int) -> dict:
    """seed_stats of one run, which must hold finite negative-advantage rows to compare (an
    empty group would drop the seed from the means silently)."""
    neg = negative_responses(read_metrics(run, name=RESPONSES_FILE, quiet=True), skip_steps)
    if not neg:
        raise IncompleteRunsError(
            f"{run}: no negative-advantage response at steps >= {skip_steps} in "
            f"{RESPONSES_FILE}; no comparison"
        )
    bad = next((r for r in neg if not _finite_row(r, flag)), None)
    if bad is not None:
        raise IncompleteRunsError(
            f"{run}: a response of step {bad['step']} has no finite entropy or {flag}; "
            "no comparison"
        )
    return seed_stats(neg, flag, skip_steps)


def _finite_row(row: dict, flag: str) -> bool:
    e = row.get("entropy")
    ok = isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e)
    return ok and isinstance(row.get(flag), bool)


def response_entropy(out_dir, *, skip_steps: int = 1) -> dict:
    """{arm: {"seeds", per-seed stats under "per_seed", and each stat's mean/se over seeds}},
    with the clip flag of the ratio the arm trains on (the BF16 shadow's for bf16 arms)."""
    out = {}
    for arm, seeds in _seed_dirs(Path(out_dir)).items():
        flag = clip_flag(next(iter(seeds.values())))
        per_seed = {s: _checked_stats(d, flag, skip_steps) for s, d in sorted(seeds.items())}
        arm_out: dict = {"seeds": sorted(seeds), "flag": flag, "per_seed": per_seed}
        for key in next(iter(per_seed.values())):
            stats = summarize_seeds([v[key] for v in per_seed.values()])
            arm_out[key] = {"mean": stats["mean"], "se": stats["se"]}
        out[arm] = arm_out
    return out


def plot_response_entropy(out_dir, path: str | Path | None = None, *, skip_steps: int = 1) -> Path:
    """One panel per arm: the entropy histograms (densities) of lower-clipped and unclipped
    negative responses, all seeds pooled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _seed_dirs(Path(out_dir))
    arms = list(runs)
    fig, axes = plt.subplots(
        1, len(arms), figsize=(3.2 * len(arms), 2.8), sharex=True, squeeze=False
    )
    for ax, arm in zip(axes[0], arms, strict=True):
        flag = clip_flag(next(iter(runs[arm].values())))
        neg = [
            r
            for d in runs[arm].values()
            for r in negative_responses(read_metrics(d, name=RESPONSES_FILE), skip_steps)
        ]
        for clipped, label, color in (
            (False, "no lower clip", "tab:blue"),
            (True, "lower-clipped", "tab:red"),
        ):
            xs = [r["entropy"] for r in neg if bool(r[flag]) is clipped]
            if xs:
                ax.hist(
                    xs,
                    bins=30,
                    density=True,
                    alpha=0.55,
                    color=color,
                    label=f"{label} (n={len(xs)})",
                )
        ax.set_title(arm, fontsize=9)
        ax.set_xlabel("mean token entropy of a response (nats)", fontsize=8)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("density")
    fig.tight_layout()
    target = Path(path) if path else Path(out_dir) / "response_entropy.png"
    save_figure(fig, target, dpi=120)
    plt.close(fig)
    return target


def table(stats: dict) -> str:
    def cell(s, digits=3):
        m, se = s["mean"], s["se"]
        if m is None:
            return "-"
        return f"{m:.{digits}f} ± {se:.{digits}f}" if se is not None else f"{m:.{digits}f}"

    lines = [
        "| arm | entropy, lower-clipped | entropy, not clipped | clipped share of N "
        "| clipped share of the top 10 % entropy |",
        "|---|---|---|---|---|",
    ]
    for arm, a in stats.items():
        lines.append(
            f"| {arm} | {cell(a['entropy_clipped'])} | {cell(a['entropy_unclipped'])} | "
            f"{cell(a['clipped_share'])} | {cell(a['top10_clipped_share'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fp8rl.study.response_entropy SWEEP_OUT_DIR", file=sys.stderr)
        return 2
    try:
        stats = response_entropy(args[0])
    except (Fp8rlError, OSError) as e:
        print(f"response_entropy: error: {one_line(e)}", file=sys.stderr)
        return 2
    if not stats:
        print(
            f"no {RESPONSES_FILE} under {args[0]}/ARM/seed-S (log.response_stats: true)",
            file=sys.stderr,
        )
        return 2
    print(table(stats))
    try:
        print(f"\n{plot_response_entropy(args[0])}")
    except OSError as e:  # an unwritable folder: the table stands, the plot is one line
        print(f"response_entropy: error: {one_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
