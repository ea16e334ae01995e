"""The long-horizon study's verdict (docs/study-long.md, "The verdict rule", fixed before the
confirmatory runs), its tables and its plots, from a finished sweep folder or the committed raw
runs (docs/study-long/runs: config.json, done.json and metrics.jsonl.gz per run).

    python -m fp8rl.study.long_verdict runs/study-long [--ref bf16]

For an arm A: D(A) = how many of its seeds degrade (study/degradation.py; judged against the band
of the reference's seeds, the reference judged alone) and G(A) = the seed-paired difference
A - reference of reward_last (mean, 95 % t-interval).
  A goes wrong       D(A) >= 3 while D(ref) <= 1, or G(A)'s interval lies below 0 with mean <= -0.05
  A stays on track   D(A) <= 1, mean G(A) > -0.05 and the interval's upper end >= 0
Verdict from the vanilla arm (`fp8`) and the primary CC arm (`fp8-calibrated`):
  (a) vanilla goes wrong, CC stays on track and CC - vanilla reward_last has a positive mean;
  (b) vanilla goes wrong and (a) does not hold (the arms that stay on track are named);
  (c) vanilla does not go wrong; also "no verdict at this setting" when D(ref) >= 2.
Writes OUT/verdict.json, OUT/verdict.md (`--name` another stem, one per pair of a sweep) and
the plots of study/long_plots.py. Before any of it, the input is checked (`check_input`):
unfinished, short or non-finite runs, or too few seeds, give one line and no verdict.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import Fp8rlError, one_line
from ..utils import atomic_write_text, run_main
from .long_plots import bounds_summary, plot_bounds, plot_trajectories
from .run_checks import complete_runs, enough, read_json, sweep_spec
from .sweep.aggregation import load_runs
from .sweep.cells import OUTCOMES, START_STEPS, TRAJECTORY_METRICS, cell_results
from .sweep.phase import _ci, _plain
from .sweep.spec import DONE_FILE, load_spec, run_dir
from .sweep.stats import summarize_seeds, write_json

GAP = -0.05  # G(A)'s mean at or below which a confidently negative gap "goes wrong"
# the rule as written for 5 seeds; seed_thresholds(n) scales it to n seeds
WRONG_SEEDS, TRACK_SEEDS, NO_VERDICT_REF = 3, 1, 2
MIN_SEEDS = 3


def seed_thresholds(n: int) -> tuple[int, int, int]:
    """(goes wrong at D >=, on track at D <=, no verdict at D(ref) >=) for n seeds: the
    written counts as shares of 5 seeds, rounded so that n = 5 gives them back
    (docs/study-real.md, "The verdict rule": 3 seeds give 2, 0, 2)."""
    return -(-WRONG_SEEDS * n // 5), TRACK_SEEDS * n // 5, -(-NO_VERDICT_REF * n // 5)


# (outcome, label, scale, digits) of the tables
LABELS = {
    "reward_last": ("reward, last W", 1.0, 3),
    "reward_gain": ("reward gain", 1.0, 3),
    "entropy_last": ("entropy, last W (nats/token)", 1.0, 3),
    "entropy_drift": ("entropy drift", 1.0, 3),
    "garble_last": ("garble rate, last W", 1.0, 3),
    "length_last": ("response length, last W", 1.0, 1),
    "accuracy_end": ("greedy test accuracy, end", 1.0, 3),
    "lower_clip_excess": ("lower-clip excess (pp)", 100.0, 2),
}


def judge_arm(degraded: int, ref_degraded: int, gap: dict, seeds: int = 5) -> dict:
    """The protocol's two labels for one arm from D(A), D(ref) and G(A) (summarize_seeds),
    with the seed counts of `seeds` seeds (seed_thresholds)."""
    wrong_at, track_at, _ = seed_thresholds(seeds)
    mean, ci = gap.get("mean"), gap.get("ci95")
    below = ci is not None and ci[1] < 0 and mean is not None and mean <= GAP
    wrong = (degraded >= wrong_at and ref_degraded <= track_at) or below
    track = (
        degraded <= track_at and mean is not None and mean > GAP and ci is not None and ci[1] >= 0
    )
    return {"degraded": degraded, "reward_gap": gap, "goes_wrong": wrong, "on_track": track}


def _reward_per_seed(arm_result: dict) -> list:
    return arm_result["outcomes"]["reward_last"]["per_seed"]


def verdict(results: dict, vanilla: str = "fp8", cc: str = "fp8-calibrated") -> dict:
    """{"verdict": "a" | "b" | "c", "no_verdict": bool, "why", "ref_degraded", "arms":
    {ARM: judge_arm(...)}, "cc_minus_vanilla": STATS, "helping": [arms on track]} from
    cell_results of a sweep without a grid (one cell)."""
    if len(results["cells"]) != 1:
        raise Fp8rlError("long_verdict: the confirmatory sweep has one cell (no grid)")
    cell = results["cells"][0]
    for arm in (vanilla, cc):
        if arm not in cell["compare"]:
            raise Fp8rlError(f"long_verdict: no arm {arm!r} in the sweep ({list(cell['compare'])})")
    ref_d = sum(j["degraded"] for j in cell["ref"]["degradation"].values())
    n = len(cell["ref"]["degradation"])
    arms = {
        a: judge_arm(c["degraded_seeds"], ref_d, c["paired"]["reward_last"], n)
        for a, c in cell["compare"].items()
    }
    # both arms' per-seed lists are in the spec's seed order (sweep.cells sorts them)
    mine, base = _reward_per_seed(cell["compare"][cc]), _reward_per_seed(cell["compare"][vanilla])
    diff = summarize_seeds(
        [None if a is None or b is None else a - b for a, b in zip(mine, base, strict=True)]
    )
    helping = [a for a, j in arms.items() if a != vanilla and j["on_track"]]
    out = {"ref_degraded": ref_d, "arms": arms, "cc_minus_vanilla": diff, "helping": helping}
    out.update(vanilla=vanilla, cc=cc, no_verdict=ref_d >= seed_thresholds(n)[2])
    if out["no_verdict"]:
        return {
            **out,
            "verdict": "c",
            "why": f"no verdict at this setting: {ref_d} ref seeds degrade",
        }
    if not arms[vanilla]["goes_wrong"]:
        return {**out, "verdict": "c", "why": f"{vanilla} does not go wrong"}
    if arms[cc]["on_track"] and diff["mean"] is not None and diff["mean"] > 0:
        return {**out, "verdict": "a", "why": f"{vanilla} goes wrong, {cc} stays on track"}
    return {**out, "verdict": "b", "why": f"{vanilla} goes wrong, {cc} does not keep it on track"}


def wall_times(spec, out_dir) -> dict:
    """{arm: STATS of done.json's wall_s over seeds} (a resumed run counts its last attempt)."""
    spec, out = load_spec(spec), Path(out_dir)
    walls = {}
    for arm in spec.arms:
        per_seed = []
        for s in spec.seeds:
            done = read_json(run_dir(out, arm, s) / DONE_FILE)
            per_seed.append(None if done.get("resumed_at") is not None else done.get("wall_s"))
        walls[arm] = summarize_seeds(per_seed)
    return walls


def _fired(judged: dict) -> str:
    kinds = sorted({k for j in judged.values() for k in j["fired"]})
    return ", ".join(kinds) if kinds else "-"


def _scaled(stats: dict, scale: float) -> dict:
    m, se = stats.get("mean"), stats.get("se")
    return {"mean": None if m is None else m * scale, "se": None if se is None else se * scale}


def outcome_table(results: dict, walls: dict) -> str:
    """Per arm: every outcome as mean ± SE over seeds, D(A) with the criteria, the wall time."""
    cell, ref, w = results["cells"][0], results["ref"], results["final_window"]
    heads = [LABELS[k][0].replace("last W", f"last {w}") for k in OUTCOMES]
    lines = ["| arm | " + " | ".join(heads) + " | seeds degraded | wall (s) |"]
    lines.append("|---" * (len(heads) + 3) + "|")
    arms = {ref: {"outcomes": cell["ref"]["outcomes"], "degradation": cell["ref"]["degradation"]}}
    arms.update(cell["compare"])
    for arm, r in arms.items():
        cells = [_plain(_scaled(r["outcomes"][o], LABELS[o][1]), LABELS[o][2]) for o in OUTCOMES]
        d = sum(j["degraded"] for j in r["degradation"].values())
        cells.append(f"{d}/{len(r['degradation'])} ({_fired(r['degradation'])})")
        cells.append(_plain(walls.get(arm, {}), 0))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(results: dict, judged: dict) -> str:
    """Per arm: the seed-paired differences arm - ref, mean [95 % t-interval], and its labels."""
    cell, w = results["cells"][0], results["final_window"]
    keys = [k for k in OUTCOMES if k != "lower_clip_excess"]
    heads = ["Δ " + LABELS[k][0].replace("last W", f"last {w}") for k in keys]
    lines = ["| arm | " + " | ".join(heads) + " | goes wrong | stays on track |"]
    lines.append("|---" * (len(heads) + 3) + "|")
    for arm, c in cell["compare"].items():
        cells = [_ci(c["paired"][k], *LABELS[k][1:]) for k in keys]
        j = judged["arms"][arm]
        cells += ["yes" if j["goes_wrong"] else "no", "yes" if j["on_track"] else "no"]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_text(v: dict, ref_name: str = "BF16") -> str:
    d = v["cc_minus_vanilla"]
    lines = [f"**Verdict ({v['verdict']})**: {v['why']}."]
    lines.append(
        f"D({v['vanilla']}) = {v['arms'][v['vanilla']]['degraded']}, "
        f"D({v['cc']}) = {v['arms'][v['cc']]['degraded']}, D(ref) = {v['ref_degraded']}; "
        f"{v['cc']} - {v['vanilla']} reward, last W: {_ci(d, 1.0, 3)}."
    )
    lines.append(f"Arms on {ref_name}'s track: " + (", ".join(v["helping"]) or "none") + ".")
    return "\n".join(lines)


def bounds_table(bounds: dict) -> str:
    lines = [
        "| arm | lower: min .. max | upper: min .. max | lower, last step | upper, last step |"
    ]
    lines.append("|---|---|---|---|---|")
    for arm, b in bounds.items():
        lines.append(
            f"| {arm} | {b['lower_min']:.3f} .. {b['lower_max']:.3f} | "
            f"{b['upper_min']:.3f} .. {b['upper_max']:.3f} | "
            f"{_plain(b['lower_last'], 3)} | {_plain(b['upper_last'], 3)} |"
        )
    return "\n".join(lines)


def check_input(out: Path):
    """The spec of a sweep whose every run is finished and logs the trajectories the rule reads
    at every step, with enough seeds for D >= 3 to be possible and enough steps for the final
    window: else IncompleteRunsError, never a verdict."""
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, TRAJECTORY_METRICS, 0)
    need = spec.final_window + START_STEPS
    why = f"final_window + {START_STEPS}"
    enough(out, spec, runs, "the verdict rule", MIN_SEEDS, need, why)
    return spec


def write_verdict(
    out_dir,
    ref: str = "bf16",
    vanilla: str = "fp8",
    cc: str = "fp8-calibrated",
    name: str = "verdict",
):
    """NAME.json, NAME.md (the verdict, both tables, the bounds, the plots) into OUT; a second
    pair of one sweep takes another name, so that neither overwrites the other."""
    out = Path(out_dir)
    spec = check_input(out)
    results = cell_results(spec, out, ref)
    judged = verdict(results, vanilla, cc)
    walls = wall_times(spec, out)
    runs = load_runs(spec, out)
    bounds = bounds_summary(runs)
    shown = [a for a in spec.arms if a in (ref, vanilla, cc)] + [
        a for a in spec.arms if a not in (ref, vanilla, cc)
    ]
    plots = [
        plot_trajectories(out / "trajectories.png", runs, shown),
        plot_trajectories(out / f"trajectories_{name}.png", runs, [ref, vanilla, cc]),
    ]
    if bounds:
        plots.append(plot_bounds(out / "bounds_long.png", runs, list(bounds)))
    write_json(
        out / f"{name}.json",
        {"results": results, "verdict": judged, "wall_s": walls, "bounds": bounds},
    )
    text = "\n\n".join(
        [
            f"# verdict: {vanilla} and {cc} against {ref}, paired by seed",
            verdict_text(judged),
            outcome_table(results, walls),
            paired_table(results, judged),
            bounds_table(bounds) if bounds else "(no arm moves its bounds)",
            "\n".join(f"![{p.stem}]({p.name})" for p in plots),
        ]
    )
    atomic_write_text(out / f"{name}.md", text + "\n")
    return judged, text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.long_verdict")
    p.add_argument("out", help="a finished sweep's folder, or committed raw runs (spec.json)")
    p.add_argument("--ref", default="bf16")
    p.add_argument("--vanilla", default="fp8")
    p.add_argument("--cc", default="fp8-calibrated")
    p.add_argument(
        "--name", default="verdict", help="output stem (NAME.md, NAME.json): one per pair"
    )
    a = p.parse_args(argv)
    try:
        _, text = write_verdict(a.out, a.ref, a.vanilla, a.cc, a.name)
    except (Fp8rlError, OSError) as e:
        p.error(one_line(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
