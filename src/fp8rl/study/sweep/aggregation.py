"""Reading a finished sweep: every run's metric rows and done.json, reduced to statistics
over seeds (mean, SE, 95 % t-interval) in OUT/aggregate.json."""

from __future__ import annotations

from pathlib import Path

from ...utils import json_safe
from ..run_checks import IncompleteRunsError, complete_runs, read_json
from .spec import AGGREGATE_FILE, DONE_FILE, SweepSpec, load_spec, run_dir
from .stats import finite, paired, seed_mean, summarize_seeds, write_json

# (a, b) pairs whose per-row difference aggregate() reports when an arm logs both
PAIRS = (
    ("shadow/lower_clipfrac_neg_fp8", "shadow/lower_clipfrac_neg_bf16"),
    ("shadow/seq_lower_clipfrac_neg_fp8", "shadow/seq_lower_clipfrac_neg_bf16"),  # GSPO's
)


def load_runs(spec, out_dir) -> dict[str, dict[int, list[dict]]]:
    """{arm: {seed: metric rows of steps 0..train.steps-1}} of a sweep's runs, each finished
    with a row per step (study/run_checks.py; IncompleteRunsError naming the run if not)."""
    spec = load_spec(spec)
    return complete_runs(Path(out_dir), spec, ())


def reward_final(rows: list[dict], window: int) -> float | None:
    """Mean rollout/reward over the last `window` steps (their finite values)."""
    last = sorted(rows, key=lambda r: r.get("step", 0))[-window:]
    values = [v for r in last for v in (finite(r.get("rollout/reward")),) if v is not None]
    return sum(values) / len(values) if values else None


def _check_reward_windows(spec: SweepSpec, out: Path, runs: dict) -> None:
    """reward_final of every run has a value: its last final_window steps hold a finite reward
    (an all-NaN window would drop the seed from the arm's statistics silently)."""
    for arm, by_seed in runs.items():
        for seed, rows in by_seed.items():
            if reward_final(rows, spec.final_window) is None:
                raise IncompleteRunsError(
                    f"{run_dir(out, arm, seed)}: no finite rollout/reward in its last "
                    f"{spec.final_window} steps; reward_final (their mean, final_window) has "
                    "no value; no conclusion"
                )


def _metric_keys(rows_by_seed: dict) -> list[str]:
    # numbers, or null where a step's value was not finite; strings and lists are not metrics
    return sorted(
        {
            k
            for rows in rows_by_seed.values()
            for r in rows
            for k, v in r.items()
            if k != "step" and (v is None or finite(v) is not None or isinstance(v, float))
        }
    )


def _aggregate_arm(spec: SweepSpec, rows_by_seed: dict, done_by_seed: dict) -> dict:
    seeds, skip = list(spec.seeds), spec.skip_steps
    metrics = {
        k: summarize_seeds([seed_mean(rows_by_seed[s], k, skip) for s in seeds])
        for k in _metric_keys(rows_by_seed)
    }
    final = {
        "reward_final": summarize_seeds(
            [reward_final(rows_by_seed[s], spec.final_window) for s in seeds]
        )
    }
    eval_keys = sorted({k for d in done_by_seed.values() for k in d.get("eval_final", {})})
    for k in eval_keys:
        final[k.replace("eval/", "eval_final_")] = summarize_seeds(
            [done_by_seed[s].get("eval_final", {}).get(k) for s in seeds]
        )
    walls = [done_by_seed[s].get("wall_s") for s in seeds]
    final["wall_s"] = summarize_seeds(walls)
    pairs = {
        f"{a} - {b}": paired(rows_by_seed, a, b, skip_steps=skip)
        for a, b in PAIRS
        if a in metrics and b in metrics
    }
    out = {
        "seeds": seeds,
        "metrics": metrics,
        "final": final,
        "paired": pairs,
        "wall_s_total": sum(w for w in (finite(x) for x in walls) if w is not None),
    }
    gaps = nonfinite_steps(rows_by_seed, list(metrics), skip)
    return out | ({"nonfinite_steps": gaps} if gaps else {})


def nonfinite_steps(rows_by_seed: dict, keys: list[str], skip: int) -> dict:
    """{metric: steps (over all seeds) that logged it as null or non-finite}, where any did:
    the means leave those steps out, and this is the note that says so."""
    counts = {}
    for key in keys:
        n = sum(
            1
            for rows in rows_by_seed.values()
            for r in rows
            if r.get("step", 0) >= skip and key in r and finite(r[key]) is None
        )
        if n:
            counts[key] = n
    return counts


def aggregate(spec, out_dir) -> dict:
    """Statistics over seeds of a finished sweep, written to OUT/aggregate.json and returned:

    {"arms": {ARM: {"seeds": [...],
                    "metrics": {KEY: STATS},   # per seed: mean over steps >= skip_steps
                    "final": {"reward_final": STATS, "eval_final_mean@1": STATS, ...,
                              "wall_s": STATS},
                    "paired": {"A - B": STATS},  # see PAIRS and stats.paired
                    "wall_s_total": seconds,
                    "nonfinite_steps": {KEY: n}}},  # only where steps logged no finite KEY
     "skip_steps": int, "final_window": int}

    with STATS = {"mean", "se", "ci95": [lo, hi], "n", "per_seed": [...]} (stats
    .summarize_seeds); null where undefined (se and ci95 need two seeds)."""
    result = aggregate_runs(spec, out_dir)
    write_json(Path(out_dir) / AGGREGATE_FILE, result)
    return result


def aggregate_runs(spec, out_dir) -> dict:
    """What `aggregate` writes, computed from the runs without writing anything: committed raw
    runs (spec.json and the run folders) are read, not changed."""
    spec, out = load_spec(spec), Path(out_dir)
    runs = load_runs(spec, out)
    _check_reward_windows(spec, out, runs)
    arms = {}
    for arm, rows_by_seed in runs.items():
        done = {s: read_json(run_dir(out, arm, s) / DONE_FILE) for s in spec.seeds}
        arms[arm] = _aggregate_arm(spec, rows_by_seed, done)
    return json_safe(
        {"arms": arms, "skip_steps": spec.skip_steps, "final_window": spec.final_window}
    )
