"""The real-model study's judged runs read by its protocol (docs/study-real.md, "The
measurements" and "The verdict rule"), from a finished sweep or the committed raw runs.

    python -m fp8rl.study.real_report docs/study-real/runs --evals docs/study-real/evals \
        --before docs/real-model/learn-run/eval-before.json --out docs/study-real/report

Writes OUT/report.json, OUT/report.md and its plots:
- the verdict: the long study's rule with fp32 as the reference (study/long_verdict.py, its
  seed counts scaled to the number of seeds), its outcome and paired tables;
- held-out accuracy: each run's mean@8 after training (`fp8rl eval --k 8`, at
  EVALS/ARM/seed-S.json), its gain over the start model's paired by problem, and each arm's
  gap to fp32 paired by seed (95 % t-interval);
- the paper's signatures S1-S5 over the shadow steps of the FP8 arms (study/matched.py);
- the channel: the high-entropy share of the lower clips early (steps 1-49) and late
  (50-99); it opens when `fp8`'s late mean is at least 0.5 with its 95 % interval above 0.1;
  and behind it, at every shadow step, the share, the lower clips against the BF16 shadow's,
  the garble rate and the by-clip entropy and length (study/channel_steps.py);
- the garble rate by kind (`rollout/malformed_frac/KIND`) over the first 10 and the last W
  steps; entropy and length of negative-advantage responses by their clip decision
  (study/response_entropy.py).
Before any of it the input is checked: every run finished with every step logged, at least
3 seeds, and an evaluation per run; otherwise one line and nothing written.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..errors import Fp8rlError, one_line
from ..utils import atomic_write_text, run_main
from . import matched
from .channel_steps import GARBLE, channel_by_step, channel_by_step_md, plot_channel_by_step
from .learning import paired_accuracy, read_eval
from .long_plots import plot_trajectories
from .long_verdict import (
    check_input,
    outcome_table,
    paired_table,
    verdict,
    verdict_text,
    wall_times,
)
from .real_gate import cpu_hours
from .response_entropy import plot_response_entropy, response_entropy
from .run_checks import IncompleteRunsError
from .sweep.aggregation import load_runs
from .sweep.cells import START_STEPS, cell_results
from .sweep.phase import _ci, _plain
from .sweep.spec import run_dir
from .sweep.stats import summarize_seeds, write_json

REF, VANILLA, CC = "fp32", "fp8", "fp8-calibrated"
LATE_FROM = 50  # the protocol's late window: shadow steps 50-95 of 100


# ---------------------------------------------------------------- inputs


def read_evals(spec, out: Path, evals: Path) -> dict:
    """{arm: {seed: evaluation}}: every run's held-out evaluation, checked (learning.read_eval)."""
    found: dict = {}
    for arm in spec.arms:
        for seed in spec.seeds:
            path = Path(evals) / arm / f"seed-{seed}.json"
            if not path.is_file():
                raise IncompleteRunsError(
                    f"{path}: no held-out evaluation of {run_dir(out, arm, seed)} "
                    "(fp8rl eval --k 8 --checkpoint RUN --out FILE); no report"
                )
            found.setdefault(arm, {})[seed] = read_eval(path)
    return found


# ---------------------------------------------------------------- the measurements


def held_out(before: dict, evals: dict, ref: str = REF) -> dict:
    """Per arm: mean@k after training and its gain over the start model (STATS over seeds of
    the per-seed paired-by-problem values), and the gap to `ref` paired by seed."""
    seeds = sorted(evals[ref])
    after = {
        arm: {s: paired_accuracy(before, e, ("start", f"{arm} seed {s}")) for s, e in per.items()}
        for arm, per in evals.items()
    }
    out = {}
    for arm, per in after.items():
        out[arm] = {
            "after": summarize_seeds([per[s]["after"] for s in seeds]),
            "gain": summarize_seeds([per[s]["diff"] for s in seeds]),
            "gap": summarize_seeds([per[s]["after"] - after[ref][s]["after"] for s in seeds]),
        }
    return {"before": after[ref][seeds[0]]["before"], "arms": out, "ref": ref}


def garble_kinds(runs: dict, window: int) -> dict:
    """{arm: {kind: {"first", "last"}}}: STATS over seeds of each kind's mean share over the
    first START_STEPS and the last `window` steps (the kinds every run logs at every step)."""
    logged = [
        {k for k in r if k.startswith(GARBLE + "/")}
        for seeds in runs.values()
        for rows in seeds.values()
        for r in rows
    ]
    kinds = sorted(k[len(GARBLE) + 1 :] for k in set.intersection(*logged))

    def share(rows, key, part):
        vals = [r[key] for r in sorted(rows, key=lambda r: r["step"])]
        vals = vals[:START_STEPS] if part == "first" else vals[-window:]
        return math.fsum(vals) / len(vals)

    out = {}
    for arm, seeds in runs.items():
        out[arm] = {
            kind: {
                part: summarize_seeds([share(rows, key, part) for _, rows in sorted(seeds.items())])
                for part in ("first", "last")
            }
            for kind in ("all", *kinds)
            for key in ([GARBLE] if kind == "all" else [f"{GARBLE}/{kind}"])
        }
    return out


def report(out_dir, evals_dir, before_path) -> tuple[dict, dict]:
    """Every table of the module docstring as one dict, and the runs' metric rows
    ({arm: {seed: rows}}) it read; the input checked first."""
    out = Path(out_dir)
    spec = check_input(out)
    for arm in (REF, VANILLA, CC):
        if arm not in spec.arms:
            raise Fp8rlError(f"{out}: no arm {arm!r} in the sweep ({list(spec.arms)})")
    evals = read_evals(spec, out, Path(evals_dir))
    before = read_eval(before_path)
    results = cell_results(spec, out, REF)
    runs = load_runs(spec, out)
    result = {
        "seeds": list(spec.seeds),
        "results": results,
        "verdict": verdict(results, VANILLA, CC),
        "wall_s": wall_times(spec, out),
        "cpu_hours": {
            arm: [cpu_hours(rows) for _, rows in sorted(by.items())] for arm, by in runs.items()
        },
        "held_out": held_out(before, evals),
        "signatures": matched.signature_table(spec, out, runs),
        "channel": matched.channel(spec, runs, VANILLA, LATE_FROM),
        "channel_by_step": channel_by_step(out, spec, runs, [VANILLA, CC]),
        "caps": matched.cap_table(runs),
        "garble": garble_kinds(runs, spec.final_window),
        "by_clip": response_entropy(out, skip_steps=spec.skip_steps),
    }
    return result, runs


# ---------------------------------------------------------------- the text


def held_out_table(h: dict) -> str:
    lines = [
        f"Start model: mean@8 {h['before']:.3f}.",
        "",
        "| arm | mean@8 after | gain over the start (points) | gap to fp32 (points) [95 %] |",
        "|---|---|---|---|",
    ]
    for arm, a in h["arms"].items():
        gap = "-" if arm == h["ref"] else _ci(a["gap"], 100.0, 1)
        lines.append(f"| {arm} | {_plain(a['after'], 3)} | {_ci(a['gain'], 100.0, 1)} | {gap} |")
    return "\n".join(lines)


def garble_table(g: dict) -> str:
    kinds = list(next(iter(g.values())))
    lines = [
        "| arm | " + " | ".join(f"{k}: steps 0-9 -> last W" for k in kinds) + " |",
        "|---" * (len(kinds) + 1) + "|",
    ]
    for arm, per in g.items():
        cells = [f"{_plain(per[k]['first'], 3)} -> {_plain(per[k]['last'], 3)}" for k in kinds]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def by_clip_table(stats: dict) -> str:
    keys = (
        ("clipped_share", "lower-clipped share", 3),
        ("entropy_clipped", "entropy, clipped", 3),
        ("entropy_unclipped", "entropy, not clipped", 3),
        ("length_clipped", "length, clipped", 1),
        ("length_unclipped", "length, not clipped", 1),
        ("top10_clipped_share", "clipped share of the top 10 % entropy", 3),
    )
    lines = [
        "| arm | " + " | ".join(label for _, label, _ in keys) + " | responses clipped / not |",
        "|---" * (len(keys) + 2) + "|",
    ]
    for arm, a in stats.items():
        cells = [_plain(a[k], d) for k, _, d in keys]
        n = f"{_plain(a['n_clipped'], 1)} / {_plain(a['n_unclipped'], 1)}"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {n} |")
    return "\n".join(lines)


def report_text(r: dict, plots: list[Path]) -> str:
    opens = "opens" if r["channel"]["reproduced"] else "stays shut"
    parts = [
        f"# The real-model study: {VANILLA} and {CC} against {REF}, seeds {r['seeds']}",
        verdict_text(r["verdict"], REF),
        outcome_table(r["results"], r["wall_s"]),
        paired_table(r["results"], r["verdict"]),
        "CPU-hours a run (`time/cpu_step` summed), by seed: "
        + "; ".join(
            f"{arm} " + ", ".join("-" if h is None else f"{h:.2f}" for h in hours)
            for arm, hours in r["cpu_hours"].items()
        )
        + ".",
        "## Held-out accuracy (40 problems x 8 samples at temperature 1)",
        held_out_table(r["held_out"]),
        "## The paper's signatures (shadow steps 5-95)",
        matched.signatures_md(r["signatures"]) if r["signatures"] else "(no FP8 arm)",
        f"## The channel: it {opens}",
        matched.channel_md(r["channel"]).split("\n\n")[0],
        f"The channel in `{VANILLA}` **{opens}** (it opens when the late mean is at least "
        f"{matched.REPRODUCED_MEAN} with its 95 % interval above {matched.CHANCE}, chance).",
        "### At every shadow step (metrics: mean over seeds; responses: seeds pooled)",
        channel_by_step_md(r["channel_by_step"]),
        "## Garble rate by kind (a response may show several)",
        garble_table(r["garble"]),
        "## Negative-advantage responses by clip decision (steps >= 1, shadow steps)",
        by_clip_table(r["by_clip"]),
    ]
    if r["caps"]:
        parts += ["## Calibrated bounds at the refits", matched.caps_md(r["caps"])]
    parts.append("\n".join(f"![{p.stem}]({p.name})" for p in plots))
    return "\n\n".join(parts) + "\n"


def write_report(out_dir, evals_dir, before_path, dest) -> str:
    r, runs = report(out_dir, evals_dir, before_path)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_trajectories(dest / "trajectories.png", runs, [REF, VANILLA, CC]),
        plot_response_entropy(out_dir, dest / "response_entropy.png"),
        plot_channel_by_step(dest / "channel_by_step.png", r["channel_by_step"]),
    ]
    text = report_text(r, plots)
    write_json(dest / "report.json", r)
    atomic_write_text(dest / "report.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.real_report")
    p.add_argument("out", help="the judged sweep's folder, or its committed raw runs")
    p.add_argument("--evals", required=True, help="EVALS/ARM/seed-S.json per run")
    p.add_argument("--before", required=True, help="the start model's evaluation")
    p.add_argument("--dest", required=True, help="where report.md, report.json go")
    a = p.parse_args(argv)
    try:
        text = write_report(a.out, a.evals, a.before, a.dest)
    except (Fp8rlError, OSError) as e:
        p.error(one_line(e))
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
