"""The matched study's two choosing steps (docs/study-matched.md): the BF16 gate's learning
rate, and the probes' signature table with the noise-matched recipe. Each rule is the
protocol's, fixed before the runs it reads.

    python -m fp8rl.study.matched gate runs/study-matched-gate     # gate.md / gate.json
    python -m fp8rl.study.matched probes runs/study-matched-probe  # signatures.md / .json
    python -m fp8rl.study.matched confirmatory runs/study-matched  # signatures_channel.*

Both check their input before they conclude: every run of the spec must be finished
(done.json) and log every step 0..train.steps-1 with the metrics the rule reads finite;
otherwise they stop with one line naming the run, the step and the metric, and write nothing.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..config.precision import HIGH_PRECISIONS
from ..errors import Fp8rlError
from ..utils import run_main
from .run_checks import IncompleteRunsError, complete_runs, sweep_spec
from .sweep.cells import cell_results
from .sweep.stats import summarize_seeds, write_report

GATE_METRICS = ("rollout/reward", "rollout/entropy", "rollout/malformed_frac")
PROBE_METRICS = (
    "shadow/nmae_prob",
    "shadow/nmae_quotient",
    "shadow/clipfrac_fp8",
    "shadow/clipfrac_bf16",
    "shadow/clipfrac_lower_neg_fp8",
    "shadow/clipfrac_lower_neg_bf16",
)
# (key, what it is, lowest, highest): met when a recipe's mean over seeds lies in [lo, hi]
SIGNATURES = (
    ("S1", "probability NMAE", 0.01, 0.03),
    ("S2", "NMAE quotient", 1.7, 2.9),
    ("S3", "FP8 / BF16 clip fraction", 3.0, 6.0),
    ("S4", "extra clips at the lower bound", 0.7, math.inf),
    ("S5", "lower clips in high-entropy responses", 0.3, math.inf),
)
NMAE_TARGET = 0.02  # ties between recipes go to the NMAE nearest this (log distance)


# ---- step 1: the BF16 gate ------------------------------------------------------------


def gate(out_dir, ref: str = "bf16") -> dict:
    """The gate's cells (learning rate, stable, learns) and the chosen rate: the largest one
    at which no seed degrades and the mean reward_gain is > 0; None when none passes."""
    out = Path(out_dir)
    spec = sweep_spec(out)
    complete_runs(out, spec, GATE_METRICS, 0)
    results = cell_results(spec, out, ref)
    cells = []
    for c in results["cells"]:
        arm = c["arms"][ref]
        lr = float(spec.run_data(arm, spec.seeds[0], out)["train"]["lr"])
        fired = {s: sorted(j["fired"]) for s, j in c["ref"]["degradation"].items() if j["degraded"]}
        outcomes = c["ref"]["outcomes"]
        cells.append(
            {
                "cell": c["name"],
                "lr": lr,
                "stable": c["ref"]["stable"],
                "learns": c["ref"]["learns"],
                "degraded": fired,
                **{k: outcomes[k] for k in ("reward_gain", "reward_last", "garble_last")},
                "entropy_drift": outcomes["entropy_drift"],
                "accuracy_end": outcomes["accuracy_end"],
            }
        )
    rates = [c["lr"] for c in cells]
    if len(set(rates)) < len(rates):  # the gate chooses a rate: its cells must differ in it
        raise IncompleteRunsError(
            f"{out}: the gate's cells share learning rates ({sorted(rates)}): nothing to choose "
            "between; no conclusion"
        )
    passing = [c for c in cells if c["stable"] and c["learns"]]
    chosen = max(passing, key=lambda c: c["lr"]) if passing else None
    return {
        "cells": sorted(cells, key=lambda c: c["lr"]),
        "chosen": None if chosen is None else {"cell": chosen["cell"], "lr": chosen["lr"]},
        "seeds": list(spec.seeds),
    }


def _stat(stats: dict, scale: float = 1.0, digits: int = 3) -> str:
    if stats.get("mean") is None:
        return "-"
    se = stats.get("se")
    text = f"{stats['mean'] * scale:.{digits}f}"
    return text + (f" ± {se * scale:.{digits}f}" if se is not None else "")


def gate_md(result: dict) -> str:
    lines = [
        "| learning rate | reward gain | reward, last W | garble, last W | entropy drift "
        "| greedy test acc., end | seeds degraded | stable | learns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cells"]:
        fired = "; ".join(f"seed {s}: {', '.join(f)}" for s, f in c["degraded"].items())
        lines.append(
            f"| {c['lr']:g} | {_stat(c['reward_gain'])} | {_stat(c['reward_last'])} | "
            f"{_stat(c['garble_last'])} | {_stat(c['entropy_drift'])} | "
            f"{_stat(c['accuracy_end'])} | {len(c['degraded'])}/{len(result['seeds'])}"
            f"{' (' + fired + ')' if fired else ''} | {'yes' if c['stable'] else 'no'} | "
            f"{'yes' if c['learns'] else 'no'} |"
        )
    chosen = result["chosen"]
    lines.append("")
    lines.append(
        f"Chosen by the gate's rule: learning rate {chosen['lr']:g} ({chosen['cell']})"
        if chosen
        else "No learning rate passes: the protocol's fallback applies."
    )
    return "\n".join(lines)


# ---- step 2: the probes ------------------------------------------------------------------


def _sum(rows: list[dict], key: str) -> float:
    return math.fsum(r[key] for r in rows)


def _mean_defined(rows: list[dict], key: str) -> float | None:
    """The mean of `key` over rows, None (undefined, so unmet) if a row has no finite value:
    the NMAE quotient is null where neither probability differs (0/0)."""
    vals = [r.get(key) for r in rows]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
        return None
    return math.fsum(vals) / len(vals)


def run_signatures(rows: list[dict], skip_steps: int) -> dict:
    """S1-S5's statistics of one probe run over its steps >= skip_steps (the protocol's
    definitions: means of NMAE and quotient, ratios of sums for the clip fractions; None where
    a ratio's denominator is not positive or no step has a lower clip)."""
    # the shadow steps (every step of a probe; every 20th of a confirmatory vanilla arm)
    kept = [r for r in rows if r["step"] >= skip_steps and "shadow/nmae_prob" in r]
    if not kept:
        return dict.fromkeys(("S1", "S2", "S3", "S4", "S5"))
    fp8, bf16 = _sum(kept, "shadow/clipfrac_fp8"), _sum(kept, "shadow/clipfrac_bf16")
    extra = fp8 - bf16
    low = _sum(kept, "shadow/clipfrac_lower_neg_fp8") - _sum(kept, "shadow/clipfrac_lower_neg_bf16")
    high = [
        v
        for r in kept
        for v in (r.get("shadow/high_entropy_lower_clip_share"),)
        if isinstance(v, (int, float)) and math.isfinite(v)
    ]
    return {
        "S1": _mean_defined(kept, "shadow/nmae_prob"),
        "S2": _mean_defined(kept, "shadow/nmae_quotient"),
        "S3": fp8 / bf16 if bf16 > 0 else (math.inf if fp8 > 0 else None),
        "S4": low / extra if extra > 0 else None,
        "S5": math.fsum(high) / len(high) if high else None,
    }


def _met(key: str, mean: float | None) -> bool:
    lo, hi = next((s[2], s[3]) for s in SIGNATURES if s[0] == key)
    return mean is not None and lo <= mean <= hi


def choose_recipe(table: dict) -> dict:
    """The protocol's rule: candidates meet S1 (else all recipes); the most signatures met;
    ties to the NMAE nearest 2 %, then the spec's order."""
    order = list(table)
    if not order:
        why = "no low-precision arm logs shadow statistics: nothing to choose from"
        return {"recipe": None, "met": 0, "why": why}
    candidates = [r for r in order if table[r]["met"]["S1"]] or order

    def key(r):
        nmae = table[r]["stats"]["S1"]["mean"]
        distance = abs(math.log(nmae / NMAE_TARGET)) if nmae and nmae > 0 else math.inf
        return (-sum(table[r]["met"].values()), distance, order.index(r))

    best = min(candidates, key=key)
    met = sum(table[best]["met"].values())
    if not met:  # a recipe that matches nothing is no noise-matched recipe
        why = f"no recipe meets any of the {len(SIGNATURES)} signatures; candidates {candidates}"
        return {"recipe": None, "met": 0, "why": why}
    return {
        "recipe": best,
        "met": met,
        "why": f"{met} of {len(SIGNATURES)} signatures met; candidates {candidates}",
    }


def signature_table(spec, out: Path, runs: dict) -> dict:
    """{arm: {"precision", "stats": {S: STATS}, "met": {S: bool}}} over the low-precision
    arms that log shadow statistics (a bf16 or fp32 arm's shadow is itself: nothing to
    measure); a seed without a defined statistic leaves that signature unmet."""
    table = {}
    for arm, seeds in runs.items():
        recipe = spec.run_data(arm, spec.seeds[0], out)["train"].get("precision")
        if recipe in HIGH_PRECISIONS:  # unset: the config's default, a quantized one
            continue
        per_seed = [run_signatures(rows, spec.skip_steps) for _, rows in sorted(seeds.items())]
        if all(p["S1"] is None for p in per_seed):
            continue  # no shadow passes
        stats = {k: summarize_seeds([p[k] for p in per_seed]) for k, *_ in SIGNATURES}
        met = {
            k: _met(k, stats[k]["mean"]) and all(p[k] is not None for p in per_seed)
            for k, *_ in SIGNATURES
        }
        table[arm] = {"precision": recipe, "stats": stats, "met": met}
    return table


def probes(out_dir) -> dict:
    out = Path(out_dir)
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, PROBE_METRICS, spec.skip_steps)
    table = signature_table(spec, out, runs)
    return {"table": table, "chosen": choose_recipe(table), "seeds": list(spec.seeds)}


# ---- steps 3-4: the confirmatory runs' signatures and the high-entropy channel -----------

HIGH = "shadow/high_entropy_lower_clip_share"
LATE_FROM = 100  # the paper's surge came after about 100 steps
REPRODUCED_MEAN, CHANCE = 0.5, 0.1


def _mean_of(rows: list[dict], lo: int, hi: float) -> float | None:
    vals = [
        r[HIGH]
        for r in rows
        if lo <= r["step"] < hi and isinstance(r.get(HIGH), (int, float)) and math.isfinite(r[HIGH])
    ]
    return math.fsum(vals) / len(vals) if vals else None


def channel(spec, runs: dict, arm: str = "matched", late_from: int = LATE_FROM) -> dict:
    """Per arm with shadow statistics: the high-entropy share of its lower clips early (steps
    skip..late_from-1) and late (>= late_from), mean over shadow steps per seed, then STATS
    over seeds; `reproduced` for `arm`: late mean >= 0.5 and its 95 % interval above 0.1."""
    out = {}
    for name, seeds in runs.items():
        early = [_mean_of(rows, spec.skip_steps, late_from) for _, rows in sorted(seeds.items())]
        late = [_mean_of(rows, late_from, math.inf) for _, rows in sorted(seeds.items())]
        if all(v is None for v in early + late):
            continue
        out[name] = {"early": summarize_seeds(early), "late": summarize_seeds(late)}
    late = (out.get(arm) or {}).get("late") or {}
    ci = late.get("ci95")
    reproduced = (
        late.get("mean") is not None
        and late["mean"] >= REPRODUCED_MEAN
        and ci is not None
        and ci[0] > CHANCE
    )
    return {"arms": out, "judged_arm": arm, "reproduced": reproduced, "late_from": late_from}


REFIT_KEYS = tuple(
    f"calib/{k}" for k in ("next_lower", "lower_target", "next_upper", "upper_target")
)


def _refit_caps(rows: list[dict], run: str) -> dict | None:
    """One calibrated run's refits: how many, at how many a smoothing cap (max_step or the
    upper ceiling) held the applied bound off its target L* / H*, and the last targets."""
    refits = [r for r in rows if r.get("calib/updated") == 1.0]  # logged as a float
    if not refits:
        return None
    for r in refits:
        for key in REFIT_KEYS:
            if not isinstance(r.get(key), (int, float)) or not math.isfinite(r[key]):
                raise IncompleteRunsError(
                    f"{run}, step {r['step']}: a refit without a finite {key}"
                )

    def capped(bound: str) -> int:
        return sum(
            abs(r[f"calib/next_{bound}"] - r[f"calib/{bound}_target"]) > 1e-6 for r in refits
        )

    return {
        "refits": len(refits),
        "lower_capped": capped("lower"),
        "upper_capped": capped("upper"),
        "lower_target_last": refits[-1]["calib/lower_target"],
        "upper_target_last": refits[-1]["calib/upper_target"],
    }


def cap_table(runs: dict) -> dict:
    """{arm: {field: STATS over seeds}} for the arms that refit their bounds."""
    out = {}
    for arm, seeds in runs.items():
        per_seed = [_refit_caps(rows, f"{arm} seed {s}") for s, rows in sorted(seeds.items())]
        if all(p is None for p in per_seed):
            continue
        if any(p is None for p in per_seed):
            raise IncompleteRunsError(f"{arm}: some seeds refit their bounds, others never")
        out[arm] = {k: summarize_seeds([p[k] for p in per_seed]) for k in per_seed[0]}
    return out


def confirmatory(out_dir) -> dict:
    out = Path(out_dir)
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, GATE_METRICS, 0)
    return {
        "signatures": signature_table(spec, out, runs),
        "channel": channel(spec, runs),
        "caps": cap_table(runs),
    }


def caps_md(table: dict) -> str:
    lines = [
        "| arm | refits | lower bound held off L* by its cap | upper held off H* | L*, last refit "
        "| H*, last refit |",
        "|---|---|---|---|---|---|",
    ]
    for arm, c in table.items():
        cells = [_stat(c[k], 1.0, 1) for k in ("refits", "lower_capped", "upper_capped")]
        cells += [_stat(c[k], 1.0, 3) for k in ("lower_target_last", "upper_target_last")]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def channel_md(result: dict) -> str:
    late = result["late_from"]
    lines = [
        f"| arm | high-entropy share of lower clips, steps < {late} | steps >= {late} |",
        "|---|---|---|",
    ]
    for arm, c in result["arms"].items():
        lines.append(f"| {arm} | {_stat(c['early'], 1.0, 3)} | {_stat(c['late'], 1.0, 3)} |")
    verdict = "reproduced" if result["reproduced"] else "not reproduced"
    lines += [
        "",
        f"High-entropy channel in `{result['judged_arm']}`: **{verdict}** (late mean >= "
        f"{REPRODUCED_MEAN} with its 95 % interval above {CHANCE}).",
    ]
    return "\n".join(lines)


def signatures_md(table: dict) -> str:
    head = " | ".join(f"{k} {what} [{lo:g}, {hi:g}]" for k, what, lo, hi in SIGNATURES)
    lines = [f"| recipe | {head} | met |", "|---" * (len(SIGNATURES) + 2) + "|"]
    scale = {"S1": (100.0, 2)}
    for arm, t in table.items():
        cells = []
        for k, *_ in SIGNATURES:
            s, d = scale.get(k, (1.0, 2))
            mark = " ✓" if t["met"][k] else ""
            cells.append(_stat(t["stats"][k], s, d) + ("%" if k == "S1" else "") + mark)
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {sum(t['met'].values())} |")
    return "\n".join(lines)


def probes_md(result: dict) -> str:
    c = result["chosen"]
    chosen = (
        f"Noise-matched recipe by the protocol's rule: {c['recipe']} ({c['why']})"
        if c["recipe"] is not None
        else f"No recipe chosen: {c['why']}"
    )
    return signatures_md(result["table"]) + "\n\n" + chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.matched")
    p.add_argument("step", choices=("gate", "probes", "confirmatory"))
    p.add_argument("out", help="the finished sweep's folder")
    a = p.parse_args(argv)
    out = Path(a.out)
    try:
        if a.step == "gate":
            result, text, name = (r := gate(out)), gate_md(r), "gate"
        elif a.step == "probes":
            result, text, name = (r := probes(out)), probes_md(r), "signatures"
        else:
            result, name = (r := confirmatory(out)), "signatures_channel"
            text = "\n\n".join(
                (signatures_md(r["signatures"]), channel_md(r["channel"]), caps_md(r["caps"]))
            )
        write_report(out, name, result, text)
    except (Fp8rlError, OSError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
