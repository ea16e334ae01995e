"""The cells of a grid sweep (study/sweep/grid.py), each arm against the reference arm of its
cell, paired by seed: the long-horizon study's search table (docs/study-long.md).

    python -m fp8rl.study.sweep.phase runs/study-long-search [--ref bf16]   # writes cells.json

Per run, outcomes of its metric rows (W = the spec's final_window):
  reward_last    mean rollout/reward over the last W steps
  entropy_last   mean rollout/entropy over the last W steps
  entropy_drift  entropy_last minus the mean over the first START_STEPS steps
  garble_last    mean rollout/malformed_frac over the last W steps
  length_last    mean rollout/response_len over the last W steps
  reward_gain    reward_last minus the mean reward over the first START_STEPS steps
  accuracy_end   greedy test accuracy after the last step (done.json)
  lower_clip_excess  mean shadow/lower_clip_excess over the steps >= skip_steps that log it
and the degradation rule (study/degradation.py): an arm's seed against the band of the
reference's seeds; the reference's seeds alone (the rules that need no band).

Per cell and arm: the reference's statistics, the seed-paired differences arm - reference
(mean, SE, 95 % t-interval) and how many seeds degrade. `choose_cell` is the search's rule for
the confirmatory setting; OUT/cells.json, OUT/cells.md and OUT/phase_*.png are written by
`write_cells`.
"""

from __future__ import annotations

import math
from pathlib import Path

from ...errors import Fp8rlError
from ..degradation import degradation
from ..run_checks import IncompleteRunsError, complete_runs, enough, read_json
from .spec import DONE_FILE, SweepSpec, load_spec, run_dir
from .stats import finite, summarize_seeds

START_STEPS = 10
# what the outcomes and the degradation rule read at every step of every run
TRAJECTORY_METRICS = ("rollout/reward", "rollout/entropy", "rollout/malformed_frac")
# a paired difference's interval and the reference's band need two seeds
CELL_SEEDS = 2
CELLS_FILE, CELLS_MD = "cells.json", "cells.md"
OUTCOMES = (
    "reward_last",
    "reward_gain",
    "entropy_last",
    "entropy_drift",
    "garble_last",
    "length_last",
    "accuracy_end",
    "lower_clip_excess",
)


def _mean(values) -> float | None:
    kept = [v for v in (finite(x) for x in values) if v is not None]
    return math.fsum(kept) / len(kept) if kept else None


def _series(rows: list[dict], key: str) -> list[float | None]:
    return [finite(r.get(key)) for r in sorted(rows, key=lambda r: r["step"])]


def _minus(a, b):
    return None if a is None or b is None else a - b


def run_outcomes(rows: list[dict], done: dict, window: int, skip_steps: int = 1) -> dict:
    """The outcomes of one run (module docstring); None where a run lacks the metric."""
    reward, entropy = _series(rows, "rollout/reward"), _series(rows, "rollout/entropy")
    steps = [r["step"] for r in rows]
    excess = [finite(r.get("shadow/lower_clip_excess")) for r in rows if r["step"] >= skip_steps]
    out = {
        "reward_last": _mean(reward[-window:]),
        "entropy_last": _mean(entropy[-window:]),
        "garble_last": _mean(_series(rows, "rollout/malformed_frac")[-window:]),
        "length_last": _mean(_series(rows, "rollout/response_len")[-window:]),
        "accuracy_end": finite((done.get("eval_final") or {}).get("eval/mean@1")),
        "lower_clip_excess": _mean(excess),
        "steps": max(steps) + 1 if steps else 0,
    }
    out["reward_gain"] = _minus(out["reward_last"], _mean(reward[:START_STEPS]))
    out["entropy_drift"] = _minus(out["entropy_last"], _mean(entropy[:START_STEPS]))
    return out


def trajectory(rows: list[dict]) -> dict:
    """The per-step series study/degradation.py reads (NaN where a step's value is missing)."""
    keys = {"entropy": "rollout/entropy", "reward": "rollout/reward"}
    keys["malformed_frac"] = "rollout/malformed_frac"
    return {
        name: [math.nan if v is None else v for v in _series(rows, key)]
        for name, key in keys.items()
    }


def _judged(runs: dict, reference: dict | None) -> dict:
    """Per seed (as a string, the JSON key it becomes), the criteria that fire and the first
    step (study/degradation.py)."""
    out = {}
    for seed, rows in runs.items():
        d = degradation(trajectory(rows), reference)
        out[str(seed)] = {"degraded": d.degraded, "first_step": d.first_step, "fired": d.fired}
    return out


def _stats(per_seed: dict, key: str) -> dict:
    return summarize_seeds([per_seed[s][key] for s in sorted(per_seed)])


def _arm_against(arm_runs, arm_done, ref_runs, ref_out, spec: SweepSpec) -> dict:
    seeds = sorted(arm_runs)
    mine = {
        s: run_outcomes(arm_runs[s], arm_done[s], spec.final_window, spec.skip_steps) for s in seeds
    }
    band = [trajectory(ref_runs[s]) for s in sorted(ref_runs)]
    judged = _judged(arm_runs, band)
    return {
        "outcomes": {k: _stats(mine, k) for k in OUTCOMES},
        "paired": {
            k: summarize_seeds([_minus(mine[s][k], ref_out[s][k]) for s in seeds]) for k in OUTCOMES
        },
        "degradation": judged,
        "degraded_seeds": sum(j["degraded"] for j in judged.values()),
    }


def cell_results(spec, out_dir, ref: str = "bf16") -> dict:
    """{"ref": REF, "no_verdict": None or why no cell can be chosen (too few seeds or steps),
    "cells": [{"name", "values", "arms": {spec arm: expanded},
    "ref": {"outcomes": {K: STATS}, "degradation": {seed: ...}, "stable", "learns"},
    "compare": {ARM: {"outcomes", "paired": {K: STATS}, "degradation", "degraded_seeds"}}}]}
    with STATS as stats.summarize_seeds gives them."""
    spec, out = load_spec(spec), Path(out_dir)
    own = list(spec.arm_specs or spec.arms)
    if ref not in own:
        raise Fp8rlError(f"sweep.cells: no reference arm {ref!r} in the spec (arms {own})")
    runs = complete_runs(out, spec, TRAJECTORY_METRICS)
    try:
        need, why = spec.final_window + START_STEPS, f"final_window + {START_STEPS}"
        enough(out, spec, runs, "the choice of a cell", CELL_SEEDS, need, why)
        short = None
    except IncompleteRunsError as e:  # the table describes the runs; no cell is chosen
        short = str(e)
    done = {
        arm: {s: read_json(run_dir(out, arm, s) / DONE_FILE) for s in spec.seeds}
        for arm in spec.arms
    }
    result = []
    for cell in spec.cells():
        r = cell.arms[ref]
        ref_out = {
            s: run_outcomes(runs[r][s], done[r][s], spec.final_window, spec.skip_steps)
            for s in spec.seeds
        }
        judged = _judged(runs[r], None)
        gain = _stats(ref_out, "reward_gain")["mean"]
        entry = {
            "name": cell.name,
            "values": cell.values,
            "arms": cell.arms,
            "ref": {
                "outcomes": {k: _stats(ref_out, k) for k in OUTCOMES},
                "degradation": judged,
                "stable": not any(j["degraded"] for j in judged.values()),
                "learns": gain is not None and gain > 0,
            },
            "compare": {
                arm: _arm_against(
                    runs[cell.arms[arm]], done[cell.arms[arm]], runs[r], ref_out, spec
                )
                for arm in own
                if arm != ref
            },
        }
        result.append(entry)
    return {"ref": ref, "cells": result, "final_window": spec.final_window, "no_verdict": short}


def choose_cell(results: dict, arm: str = "fp8") -> dict:
    """The confirmatory setting (docs/study-long.md, fixed before the search): among the
    cells whose reference is stable on every seed and learns (reward_gain > 0, mean over
    seeds), else those whose reference is stable, else all, the one where the most `arm` seeds
    degrade; ties by the largest seed-paired reward gap (reference minus arm, reward_last);
    then the grid's order. Returns {"cell": name, "values", "tier": 1 | 2 | 3, "why"}; with
    too few seeds or steps for the rule, {"cell": None, ..., "why": "no verdict: ..."}."""
    if results.get("no_verdict"):
        return {"cell": None, "values": None, "tier": None, "why": results["no_verdict"]}
    cells = [c for c in results["cells"] if arm in c["compare"]]
    if not cells:
        raise Fp8rlError(f"choose_cell: no cell compares an arm {arm!r}")
    tiers = (
        (1, [c for c in cells if c["ref"]["stable"] and c["ref"]["learns"]]),
        (2, [c for c in cells if c["ref"]["stable"]]),
        (3, cells),
    )
    tier, pool = next((t, p) for t, p in tiers if p)

    def key(c):
        gap = c["compare"][arm]["paired"]["reward_last"]["mean"]
        return (c["compare"][arm]["degraded_seeds"], -gap if gap is not None else -math.inf)

    best = max(pool, key=key)  # max keeps the first of equals: the grid's order
    degraded, neg_gap = key(best)
    why = (
        f"tier {tier} ({len(pool)} cells): {degraded} {arm} seed(s) degraded, "
        f"reward gap {arm} - {results['ref']} {-neg_gap:+.4f}"
    )
    return {"cell": best["name"], "values": best["values"], "tier": tier, "why": why}
