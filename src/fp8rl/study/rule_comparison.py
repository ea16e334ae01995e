"""Issue 45's new calibration rule, chosen and judged by docs/study-matched.md's Steps 6 and 7.

    python -m fp8rl.study.rule_comparison choose runs/study-matched-rules \
        --band docs/study-matched/runs
    python -m fp8rl.study.rule_comparison judge runs/study-matched-rules-judged

`choose` (Step 6): per candidate arm `matched-RULE`, the excess ratio R = (sum over seeds of
E) / (sum of vanilla `matched`'s E), E a run's mean `shadow/lower_clip_excess` over the shadow
steps 40..280 (the first a refit has set the bounds of); a candidate with 2 of its 3 runs
degraded is out; the lower R wins, within 0.05 the higher last-50 reward, within 0.005 of that
`direct-first`. The degradation band is the bf16 arm of `--band` (the sweep has none).

`judge` (Step 7): the new rule (`matched-new`) against vanilla (`matched`), the pooled rule
(`matched-calibrated`), the oracle (`matched-oracle`) and `bf16` (the band), seeds paired:
T1 the excess ratio to vanilla per 50-step window, Fieller 95 % interval, upper end <= 0.10
in every window; T2 the reward difference to the oracle over the last 50 steps, t interval
inside [-0.02, +0.02]; T3 at most 1 degraded run (Fisher's test against vanilla and pooled
reported). The new rule wins when all three are met. The same measurements for the pooled rule
are reported, not judged. Every run must be finished and finite where read
(study/run_checks.py), else no verdict and nothing written.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..errors import Fp8rlError
from ..utils import run_main
from .degradation import degradation
from .run_checks import (
    IncompleteRunsError,
    complete_runs,
    enough,
    finished_run,
    run_steps,
    same_spec,
    sweep_spec,
)
from .sweep.cells import trajectory
from .sweep.spec import DONE_FILE, run_dir
from .sweep.stats import fieller_ratio, fisher_exact, summarize_seeds, write_report

EXCESS, REWARD = "shadow/lower_clip_excess", "rollout/reward"
SHADOW_EVERY, FIRST_SET = 20, 40  # the refit at step 20 sets the bounds from step 21
WINDOW, LAST = 50, 50
VANILLA, POOLED, NEW = "matched", "matched-calibrated", "matched-new"
ORACLE, BF16 = "matched-oracle", "bf16"
CANDIDATES = ("matched-direct-first", "matched-noise-scaled")
R_TIE, REWARD_TIE = 0.05, 0.005
T1_MAX, T2_MARGIN, T3_MAX_DEGRADED = 0.10, 0.02, 1


def shadow_steps(steps: int) -> list[int]:
    """The shadow steps whose bounds a refit has set: 40, 60, ... below `steps`."""
    return list(range(FIRST_SET, steps, SHADOW_EVERY))


def windows(steps: int) -> list[tuple[int, int, list[int]]]:
    """(first step, last step, shadow steps) of each 50-step window holding a shadow step
    whose bounds a refit has set."""
    out = []
    for lo in range(0, steps, WINDOW):
        inside = [s for s in shadow_steps(steps) if lo <= s < lo + WINDOW]
        if inside:
            out.append((lo, min(lo + WINDOW, steps) - 1, inside))
    return out


def undefined_excess(row: dict) -> bool:
    """A shadow step whose batch held no negative-advantage token: the shadow ran (its noise
    is logged) and nothing clipped at the lower bound, so the excess is undefined (logged as
    null), not missing. docs/study-matched.md, Step 6's dated note: such steps are left out."""
    ran = isinstance(row.get("shadow/nmae_prob"), (int, float))
    return (
        ran
        and row.get(EXCESS) is None
        and row.get("shadow/lower_clipfrac_neg_fp8") is None
        and row.get("shadow/clipfrac_lower_neg_fp8") == 0
        and row.get("shadow/clipfrac_lower_neg_bf16") == 0
    )


def _at(rows: list[dict], steps: list[int], key: str, who: str) -> float:
    """The mean of `key` over `steps`; an excess undefined at a step (undefined_excess) is left
    out; anything else missing or non-finite, or no step left, is no verdict."""
    values = []
    for s in steps:
        row = rows[s] if s < len(rows) else {}
        if key == EXCESS and undefined_excess(row):
            continue
        v = row.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            raise IncompleteRunsError(f"{who}: step {s} has no finite {key} ({v!r}); no verdict")
        values.append(v)
    if not values:
        raise IncompleteRunsError(f"{who}: no step of {steps} defines {key}; no verdict")
    return math.fsum(values) / len(values)


def last_reward(rows: list[dict], who: str) -> float:
    n = len(rows)
    return _at(rows, list(range(n - LAST, n)), REWARD, who)


def degraded_seeds(runs: dict, band: list[dict]) -> dict[int, dict]:
    """seed -> the criteria that fired (study/degradation.py), for the seeds that degraded."""
    out = {}
    for seed, rows in sorted(runs.items()):
        fired = degradation(trajectory(rows), band).fired
        if fired:
            out[seed] = fired
    return out


def _arms(runs: dict, need: tuple[str, ...], out: Path) -> None:
    missing = [a for a in need if a not in runs]
    if missing:
        raise Fp8rlError(
            f"{out}: no arm {', '.join(missing)} (arms: {', '.join(runs)}); no verdict"
        )
    seeds = {a: sorted(runs[a]) for a in need}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise Fp8rlError(f"{out}: the arms' seeds differ ({seeds}); runs must be seed-paired")


def band_runs(out: Path, arm: str = BF16) -> list[dict]:
    """The trajectories of every finished run of `arm` in the sweep `out` (the band)."""
    out = Path(out)
    spec = sweep_spec(out)
    if arm not in spec.arms:
        raise Fp8rlError(f"{out}: no arm {arm!r} to draw the band from")
    band = []
    for seed in spec.seeds:
        folder = run_dir(out, arm, seed)
        data = spec.run_data(arm, seed, out)
        steps = run_steps(folder, (data.get("train") or {}).get("steps"))
        if not (folder / DONE_FILE).is_file():
            raise IncompleteRunsError(f"{folder}: not finished; no band, no verdict")
        same_spec(folder, data)
        band.append(trajectory(finished_run(folder, steps, ("rollout/entropy",))))
    return band


def choose(out, band_dir) -> dict:
    """Step 6's choice between the candidate rules (module docstring)."""
    out = Path(out)
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, (REWARD,))
    _arms(runs, (VANILLA, *CANDIDATES), out)
    steps = len(next(iter(runs[VANILLA].values())))
    enough(out, spec, runs, "the choice", 2, 300, "the protocol's run length")
    band = band_runs(Path(band_dir))
    sets = shadow_steps(steps)
    excess = {
        arm: {
            s: _at(rows, sets, EXCESS, str(run_dir(out, arm, s))) for s, rows in runs[arm].items()
        }
        for arm in (VANILLA, *CANDIDATES)
    }
    vanilla = math.fsum(excess[VANILLA].values())
    table = {}
    for arm in (VANILLA, *CANDIDATES):
        rewards = [last_reward(rows, str(run_dir(out, arm, s))) for s, rows in runs[arm].items()]
        table[arm] = {
            "excess_per_seed": excess[arm],
            "excess_ratio": math.fsum(excess[arm].values()) / vanilla if vanilla > 0 else None,
            "reward_last": summarize_seeds(rewards),
            "degraded": degraded_seeds(runs[arm], band),
        }
    if not vanilla > 0:
        raise IncompleteRunsError(f"{out}: vanilla's excess sums to {vanilla}; no ratio, no choice")
    return {"shadow_steps": sets, "arms": table, "chosen": pick(table), "seeds": spec.seeds}


def pick(table: dict) -> str:
    """The protocol's rule over the candidates' rows of `table` (module docstring)."""
    alive = [a for a in CANDIDATES if len(table[a]["degraded"]) < 2]
    if not alive:
        raise Fp8rlError("every candidate has 2 or more degraded runs: none to carry to Step 7")
    if len(alive) == 1:
        return alive[0]
    a, b = sorted(alive, key=lambda x: table[x]["excess_ratio"])
    if table[b]["excess_ratio"] - table[a]["excess_ratio"] >= R_TIE:
        return a
    ra, rb = (table[x]["reward_last"]["mean"] for x in (a, b))
    if abs(ra - rb) >= REWARD_TIE:
        return a if ra > rb else b
    return "matched-direct-first"


def excess_ratios(runs: dict, arm: str, steps: int, out: Path) -> list[dict]:
    """Per window: `arm`'s excess over vanilla's, seed-paired, with its Fieller interval."""
    rows = []
    for lo, hi, inside in windows(steps):
        num, den = (
            [_at(r, inside, EXCESS, f"{out}/{a}/seed-{s}") for s, r in sorted(runs[a].items())]
            for a in (arm, VANILLA)
        )
        rows.append({"window": [lo, hi], "shadow_steps": inside, **fieller_ratio(num, den)})
    return rows


def judge_rule(runs: dict, arm: str, band: list[dict], steps: int, out: Path) -> dict:
    """T1, T2 and T3 of the protocol for `arm` (module docstring)."""
    ratios = excess_ratios(runs, arm, steps, out)
    t1 = all(w["ci"] is not None and w["mean_den"] > 0 and w["ci"][1] <= T1_MAX for w in ratios)
    diff = summarize_seeds(
        [
            last_reward(runs[arm][s], f"{out}/{arm}/seed-{s}")
            - last_reward(runs[ORACLE][s], f"{out}/{ORACLE}/seed-{s}")
            for s in sorted(runs[arm])
        ]
    )
    t2 = -T2_MARGIN <= diff["ci95"][0] and diff["ci95"][1] <= T2_MARGIN
    degraded = degraded_seeds(runs[arm], band)
    n = len(runs[arm])
    fisher = {
        other: fisher_exact(len(degraded), n, len(degraded_seeds(runs[other], band)), n)
        for other in (VANILLA, POOLED)
        if other != arm
    }
    return {
        "t1_windows": ratios,
        "t1_met": t1,
        "t2_reward_minus_oracle": diff,
        "t2_met": t2,
        "t3_degraded": degraded,
        "t3_met": len(degraded) <= T3_MAX_DEGRADED,
        "t3_fisher_p": fisher,
    }


def judge(out) -> dict:
    """Step 7's verdict (module docstring)."""
    out = Path(out)
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, (REWARD, "rollout/entropy", "rollout/malformed_frac"))
    _arms(runs, (BF16, VANILLA, POOLED, NEW, ORACLE), out)
    enough(out, spec, runs, "the judged comparison", 7, 300, "the protocol's run length")
    steps = len(next(iter(runs[VANILLA].values())))
    band = [trajectory(runs[BF16][s]) for s in sorted(runs[BF16])]
    new = judge_rule(runs, NEW, band, steps, out)
    wins = new["t1_met"] and new["t2_met"] and new["t3_met"]
    return {
        "seeds": spec.seeds,
        "steps": steps,
        "new": new,
        "pooled": judge_rule(runs, POOLED, band, steps, out),
        "degraded": {a: degraded_seeds(runs[a], band) for a in (VANILLA, ORACLE, BF16)},
        "verdict": "the new rule wins" if wins else "the new rule does not win",
    }


def _ci(c) -> str:
    return "[-]" if c is None else f"[{c[0]:+.3f}, {c[1]:+.3f}]"


def choose_md(r: dict) -> str:
    lines = [
        f"Step 6 (seeds {', '.join(map(str, r['seeds']))}): E = mean lower-clip excess (pp) over "
        f"shadow steps {r['shadow_steps'][0]}..{r['shadow_steps'][-1]}; R = excess ratio to "
        "vanilla.",
        "",
        "| arm | E per seed (pp) | R | reward, last 50 | degraded runs |",
        "|---|---|---|---|---|",
    ]
    for arm, t in r["arms"].items():
        per = ", ".join(f"{100 * v:.2f}" for _, v in sorted(t["excess_per_seed"].items()))
        ratio = "-" if arm == VANILLA else f"{t['excess_ratio']:.3f}"
        rw = t["reward_last"]
        fired = "; ".join(f"seed {s}: {', '.join(f)}" for s, f in t["degraded"].items()) or "none"
        lines.append(f"| {arm} | {per} | {ratio} | {rw['mean']:.3f} ± {rw['se']:.3f} | {fired} |")
    lines += ["", f"**Chosen by the protocol's rule: `{r['chosen']}`.**"]
    return "\n".join(lines)


def _rule_md(name: str, j: dict) -> list[str]:
    lines = [
        f"**{name}**",
        "",
        "| window | shadow steps | excess ratio to vanilla | 95 % Fieller interval |",
    ]
    lines.append("|---|---|---|---|")
    for w in j["t1_windows"]:
        ratio = "-" if w["ratio"] is None else f"{w['ratio']:+.3f}"
        steps = ", ".join(map(str, w["shadow_steps"]))
        lines.append(f"| {w['window'][0]}-{w['window'][1]} | {steps} | {ratio} | {_ci(w['ci'])} |")
    d = j["t2_reward_minus_oracle"]
    fired = "; ".join(f"seed {s}: {', '.join(f)}" for s, f in j["t3_degraded"].items()) or "none"
    fisher = ", ".join(f"against `{a}` p = {p:.3f}" for a, p in j["t3_fisher_p"].items())
    lines += [
        "",
        f"- T1 (every window's upper end <= {T1_MAX}): {'met' if j['t1_met'] else 'not met'}",
        f"- T2 (reward minus oracle, last 50: {d['mean']:+.3f} {_ci(d['ci95'])}, inside "
        f"[-{T2_MARGIN}, +{T2_MARGIN}]): {'met' if j['t2_met'] else 'not met'}",
        f"- T3 (degraded runs {len(j['t3_degraded'])}, at most {T3_MAX_DEGRADED}): "
        f"{'met' if j['t3_met'] else 'not met'}; {fired}; Fisher {fisher}",
        "",
    ]
    return lines


def judge_md(r: dict) -> str:
    lines = [f"Step 7 (seeds {', '.join(map(str, r['seeds']))}, {r['steps']} steps)", ""]
    lines += _rule_md("`matched-new` (judged)", r["new"])
    lines += _rule_md("`matched-calibrated` (reported, not judged)", r["pooled"])
    for arm, d in r["degraded"].items():
        lines.append(f"- `{arm}` degraded runs: {len(d)}")
    lines += ["", f"**Verdict: {r['verdict']}.**"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.rule_comparison")
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("choose", help="Step 6: choose the new rule")
    c.add_argument("out")
    c.add_argument("--band", required=True, help="a sweep whose bf16 arm is the band")
    j = sub.add_parser("judge", help="Step 7: the verdict")
    j.add_argument("out")
    a = p.parse_args(argv)
    name = "rule-choice" if a.what == "choose" else "rule-comparison"
    try:
        result = choose(a.out, a.band) if a.what == "choose" else judge(a.out)
        text = choose_md(result) if a.what == "choose" else judge_md(result)
        write_report(Path(a.out), name, result, text)
    except (Fp8rlError, OSError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
