"""What happens around a Calibrated Clipping refit (issue 45, item 1): per refit of every
calibrated (CC) run, the move of its clip bounds and the change of reward and entropy across
it, seed-paired with the vanilla arm of the same pair; and for each degradation of a CC run,
the refit before it against all refits.

    python -m fp8rl.study.refit_events docs/study-matched/runs --to docs/study-matched

Timing: at a refit step s the new bounds (`calib/next_lower`, `calib/next_upper`) apply from
the updates of step s+1, and the rollout of step t comes from the policy after step t-1's
updates, so the first rollout a refit can touch is step s+2 (LAG). The change of a metric is
its mean over steps s+2..s+K+1 minus its mean over the K steps before (s+2-K..s+1); the same
difference in the seed-paired vanilla run at the same steps is subtracted, removing the trend
both runs share (same warm start, prompts and sampling seeds). A CC arm's vanilla pair is the
arm whose spec is the CC arm's without `loss` and `calibration`.

A degradation's onset is the first step of the condition that fired it (the reward-drop
criterion fires at the 20th step of its run: onset = fired - 19); its refit is the last one
whose first touched step (s+2) is at or before the onset. Every run must be finished and log
every step (study/run_checks.py); a refit without its bounds, or a window step missing from
either run, is an error, never a result. Refits whose after-window passes the run's end are
left out and counted.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..errors import Fp8rlError
from ..utils import run_main
from .degradation import BAND_STEPS, REWARD_WINDOW, SURGE_STEPS
from .run_checks import IncompleteRunsError, complete_runs, read_json, sweep_spec
from .sweep.spec import run_dir
from .sweep.stats import summarize_seeds, write_report

K = 5
LAG = 2
TOL = 1e-6  # a bound within this of its target is at it (as study/matched.py's cap table)
METRICS = {"reward": "rollout/reward", "entropy": "rollout/entropy"}
BOUND_KEYS = ("lower", "next_lower", "lower_target", "upper", "next_upper", "upper_target")
# the steps of the condition each degradation criterion needs before it fires
CONDITION_STEPS = {
    "reward_drop": REWARD_WINDOW,
    "entropy_surge": BAND_STEPS,
    "entropy_collapse": BAND_STEPS,
    "surge_detector": SURGE_STEPS,
    "garble": 1,
}
LEVEL_EDGES = (0.3, 0.5, 0.7)  # lower-bound levels: < 0.3, 0.3-0.5, 0.5-0.7, >= 0.7
SIZES = ("down, full step", "down, partial", "none", "up, partial", "up, full step")


def cc_pairs(arms: dict) -> dict[str, str]:
    """{CC arm: its vanilla arm}: the arm whose options are the CC arm's without `loss` and
    `calibration`, and which sets no loss of its own; exactly one, else an error."""
    pairs = {}
    for arm, opts in arms.items():
        if ((opts or {}).get("loss") or {}).get("mode") != "calibrated":
            continue
        rest = {k: v for k, v in opts.items() if k not in ("loss", "calibration")}
        same = [
            a
            for a, o in arms.items()
            if a != arm
            and "loss" not in (o or {})
            and {k: v for k, v in (o or {}).items() if k != "calibration"} == rest
        ]
        if len(same) != 1:
            raise IncompleteRunsError(
                f"spec arm {arm}: needs exactly one vanilla arm with its settings but no loss "
                f"or calibration section, found {same or 'none'}; no conclusion"
            )
        pairs[arm] = same[0]
    if not pairs:
        raise IncompleteRunsError("spec: no arm with loss.mode calibrated; nothing to analyse")
    return pairs


def _value(by_step: dict, step: int, key: str, who: str) -> float:
    row = by_step.get(step)
    value = None if row is None else row.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise IncompleteRunsError(f"{who}: step {step} has no finite {key} ({value!r})")
    return float(value)


def window_change(by_step: dict, first: int, k: int, key: str, who: str) -> float:
    """Mean of `key` over steps first..first+k-1 minus its mean over first-k..first-1."""
    after = [_value(by_step, t, key, who) for t in range(first, first + k)]
    before = [_value(by_step, t, key, who) for t in range(first - k, first)]
    return math.fsum(after) / k - math.fsum(before) / k


def size_group(move: float, cap: float) -> str:
    """A move's direction and size against its cap: none, partial, or the full step the cap
    allows."""
    if abs(move) <= TOL:
        return "none"
    return ("down, " if move < 0 else "up, ") + (
        "full step" if abs(move) >= cap - TOL else "partial"
    )


def level_group(level: float) -> str:
    edges = (0.0, *LEVEL_EDGES)
    i = sum(level >= e for e in LEVEL_EDGES)
    return f">= {edges[i]:g}" if i == len(LEVEL_EDGES) else f"{edges[i]:g}-{edges[i + 1]:g}"


def _refit(row: dict, caps: tuple[float, float], who: str) -> dict:
    b = {name: _value({row["step"]: row}, row["step"], f"calib/{name}", who) for name in BOUND_KEYS}
    out = {"step": row["step"], "first_touched": row["step"] + LAG}
    for side, cap in zip(("lower", "upper"), caps, strict=True):
        move = b[f"next_{side}"] - b[side]
        out |= {
            f"{side}_old": b[side],
            f"{side}_new": b[f"next_{side}"],
            f"{side}_target": b[f"{side}_target"],
            f"{side}_move": move,
            f"{side}_capped": abs(b[f"next_{side}"] - b[f"{side}_target"]) > TOL,
            f"{side}_size": size_group(move, cap),
        }
    out["lower_level"] = level_group(out["lower_new"])
    return out


def _changes(cc: dict, van: dict, first: int, k: int, who: str) -> dict:
    """Per metric its change across `first` in CC, in vanilla, and CC - vanilla (the name)."""
    out = {}
    for name, key in METRICS.items():
        mine = window_change(cc, first, k, key, who)
        theirs = window_change(van, first, k, key, f"{who} (its vanilla pair)")
        out |= {f"{name}_cc": mine, f"{name}_vanilla": theirs, name: mine - theirs}
    return out


def refit_events(cc_rows: list[dict], vanilla_rows: list[dict], caps, k: int = K, who="") -> dict:
    """{"events": one dict per refit of a CC run (bounds, moves, and per metric the change in
    CC, in vanilla and CC - vanilla), "left_out": refit steps whose window passes the end}.
    `caps` = (max_step_lower, max_step_upper) of the run."""
    cc = {r["step"]: r for r in cc_rows}
    van = {r["step"]: r for r in vanilla_rows}
    end = max(cc) + 1
    events, left_out = [], []
    for row in sorted(cc_rows, key=lambda r: r["step"]):
        if row.get("calib/updated") != 1.0:  # logged as a float
            continue
        if row["step"] + LAG + k > end:
            left_out.append(row["step"])
            continue
        event = _refit(row, caps, who)
        events.append(event | _changes(cc, van, event["first_touched"], k, who))
    if not events and not left_out:
        raise IncompleteRunsError(f"{who}: a calibrated run without a refit; no conclusion")
    return {"events": events, "left_out": left_out}


def placebo_changes(cc_rows: list[dict], vanilla_rows: list[dict], k: int = K, who="") -> list:
    """The paired change (CC - vanilla, per metric) across steps halfway between refits, where
    no bound moves: how large such changes are by chance. One dict per refit step s with its
    window s + half the gap to the next refit (the last refit reuses the previous gap)."""
    cc = {r["step"]: r for r in cc_rows}
    van = {r["step"]: r for r in vanilla_rows}
    refits = sorted(r["step"] for r in cc_rows if r.get("calib/updated") == 1.0)
    gaps = [b - a for a, b in zip(refits, refits[1:], strict=False)]
    out = []
    for i, s in enumerate(refits):
        half = gaps[min(i, len(gaps) - 1)] // 2 if gaps else 0
        first = s + half + LAG
        # its windows must not overlap the refits' (s+2-k..s+2+k-1 on either side)
        if half < k or first + k > max(cc) + 1:
            continue
        changes = _changes(cc, van, first, k, who)
        out.append({"step": first - LAG} | {name: changes[name] for name in METRICS})
    return out


def _stats(values: list[float]) -> dict:
    s = summarize_seeds(values)
    return {"mean": s["mean"], "se": s["se"], "n": s["n"]}


def group_table(events: list[dict], field: str, order=None) -> list[dict]:
    """Per value of `field` (in `order`, else sorted): the count, the mean lower move and
    level, and mean +- SE over refits of each metric's change in CC, vanilla and paired."""
    values = order or sorted({e[field] for e in events})
    out = []
    for value in values:
        chosen = [e for e in events if e[field] == value]
        if not chosen:
            continue
        row = {"group": value, "n": len(chosen)}
        for key in ("lower_move", "upper_move", "lower_new"):
            row[key] = math.fsum(e[key] for e in chosen) / len(chosen)
        for name in METRICS:
            for part in ("cc", "vanilla"):
                row[f"{name}_{part}"] = _stats([e[f"{name}_{part}"] for e in chosen])
            row[name] = _stats([e[name] for e in chosen])
        out.append(row)
    return out


def mid_rank(value: float, population: list[float]) -> float:
    """The share of `population` below `value`, ties (within TOL) counted half."""
    below = sum(p < value - TOL for p in population)
    ties = sum(abs(p - value) <= TOL for p in population)
    return (below + 0.5 * ties) / len(population)


def dips(verdict: dict, arm: str) -> list[dict]:
    """The degradations of `arm`'s runs in a sweep verdict, one per fired criterion."""
    cell = verdict["results"]["cells"][0]
    found = cell["compare"].get(arm)
    if found is None:
        raise IncompleteRunsError(f"verdict: no arm {arm} in its comparison; no conclusion")
    out = []
    for seed, d in sorted(found["degradation"].items(), key=lambda kv: int(kv[0])):
        for criterion, step in sorted(d["fired"].items()):
            onset = step - CONDITION_STEPS[criterion] + 1
            out.append(
                {
                    "arm": arm,
                    "seed": int(seed),
                    "criterion": criterion,
                    "fired": step,
                    "onset": onset,
                }
            )
    return out


def match_dip(dip: dict, events: list[dict]) -> dict:
    """`dip` with the last refit of its run that touched a rollout at or before its onset,
    and where that refit's |lower move| and lower level rank among all of `events` of its
    pair (mid-rank) and the share of them of the same move size."""
    pool = [e for e in events if e["arm"] == dip["arm"]]
    own = [e for e in pool if e["seed"] == dip["seed"] and e["first_touched"] <= dip["onset"]]
    if not own:
        return dip | {"refit": None}
    e = max(own, key=lambda x: x["step"])
    return dip | {
        "refit": {key: e[key] for key in ("step", "lower_move", "lower_new", "lower_capped")}
        | {
            "lower_size": e["lower_size"],
            "steps_after": dip["onset"] - e["first_touched"],
            "move_rank": mid_rank(abs(e["lower_move"]), [abs(x["lower_move"]) for x in pool]),
            "level_rank": mid_rank(e["lower_new"], [x["lower_new"] for x in pool]),
            # against the pair's other runs at the same refit: lower than its peers, or late?
            "level_rank_same_step": mid_rank(
                e["lower_new"], [x["lower_new"] for x in pool if x["step"] == e["step"]]
            ),
            "same_size_share": sum(x["lower_size"] == e["lower_size"] for x in pool) / len(pool),
        }
    }


def dip_summary(matched: list[dict], events: list[dict]) -> dict:
    """Counts against chance: how many dips follow a full-step move (and how many would if the
    refit before each were any refit of its pair), and the mean level ranks (0.5 by chance)."""
    found = [d for d in matched if d["refit"] is not None]
    if not found:
        return {"dips": len(matched), "with_refit": 0}

    def share(arm: str) -> float:
        pool = [e for e in events if e["arm"] == arm]
        return sum(e["lower_size"].endswith("full step") for e in pool) / len(pool)

    def mean(key: str) -> float:
        return math.fsum(d["refit"][key] for d in found) / len(found)

    return {
        "dips": len(matched),
        "with_refit": len(found),
        "after_full_step": sum(d["refit"]["lower_size"].endswith("full step") for d in found),
        "after_full_step_by_chance": math.fsum(share(d["arm"]) for d in found),
        "mean_move_rank": mean("move_rank"),
        "mean_level_rank": mean("level_rank"),
        "mean_level_rank_same_step": mean("level_rank_same_step"),
    }


def _caps(out: Path, arm: str, seed: int) -> tuple[float, float]:
    path = run_dir(out, arm, seed) / "config.json"
    cal = read_json(path).get("calibration") or {}
    caps = (cal.get("max_step_lower"), cal.get("max_step_upper"))
    if not all(isinstance(c, (int, float)) and c > 0 for c in caps):
        raise IncompleteRunsError(f"{path}: no calibration.max_step_lower/upper ({caps})")
    return caps


def _all_events(out: Path, runs: dict, pairs: dict, k: int) -> tuple[list, dict, dict]:
    events, left_out, placebo = [], {}, {}
    for arm, vanilla in pairs.items():
        for seed, rows in sorted(runs[arm].items()):
            who = f"{run_dir(out, arm, seed)}"
            r = refit_events(rows, runs[vanilla][seed], _caps(out, arm, seed), k, who)
            events += [{"arm": arm, "seed": seed} | e for e in r["events"]]
            placebo.setdefault(arm, []).extend(
                {"seed": seed} | p for p in placebo_changes(rows, runs[vanilla][seed], k, who)
            )
            if r["left_out"]:
                left_out[f"{arm} seed {seed}"] = r["left_out"]
    return events, left_out, placebo


def _groups(events: list[dict], pairs: dict) -> dict:
    levels = [level_group(x) for x in (0.0, *LEVEL_EDGES)]
    scopes = {arm: [e for e in events if e["arm"] == arm] for arm in pairs} | {"all": events}
    return {
        "pair": {"all refits": group_table(events, "arm", list(pairs))},
        "lower_size": {a: group_table(ev, "lower_size", SIZES) for a, ev in scopes.items()},
        "upper_size": {a: group_table(ev, "upper_size", SIZES) for a, ev in scopes.items()},
        "lower_level": {a: group_table(ev, "lower_level", levels) for a, ev in scopes.items()},
    }


def compute(out_dir, verdict_name: str = "verdict-matched.json", k: int = K) -> dict:
    out = Path(out_dir)
    if k < 1:
        raise Fp8rlError(f"--k {k}: must be >= 1 (steps on each side of a refit)")
    spec = sweep_spec(out)
    pairs = cc_pairs(spec.arms)
    runs = complete_runs(out, spec, tuple(METRICS.values()))
    verdict = read_json(out / verdict_name)
    events, left_out, placebo = _all_events(out, runs, pairs, k)
    matched = [match_dip(d, events) for arm in pairs for d in dips(verdict, arm)]
    return {
        "k": k,
        "lag": LAG,
        "verdict": verdict_name,
        "pairs": pairs,
        "runs": {arm: len(runs[arm]) for arm in pairs},
        "left_out": left_out,
        "groups": _groups(events, pairs),
        "placebo": {
            arm: {"n": len(p)} | {name: _stats([x[name] for x in p]) for name in METRICS}
            for arm, p in placebo.items()
        },
        "dip_summary": dip_summary(matched, events),
        "dips": matched,
        "events": events,
    }


def _pm(s: dict, digits: int = 3) -> str:
    if s["mean"] is None:
        return "-"
    se = "" if s["se"] is None else f" ± {s['se']:.{digits}f}"
    return f"{s['mean']:+.{digits}f}{se}"


def group_md(rows: list[dict], title: str) -> list[str]:
    lines = [
        f"| {title} | refits | mean lower move | mean upper move | mean new lower bound "
        "| Δ reward CC | Δ reward vanilla | **Δ reward CC - vanilla** "
        "| **Δ entropy CC - vanilla** |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['group']} | {r['n']} | {r['lower_move']:+.3f} | {r['upper_move']:+.3f} "
            f"| {r['lower_new']:.3f} | {_pm(r['reward_cc'])} | {_pm(r['reward_vanilla'])} "
            f"| {_pm(r['reward'])} | {_pm(r['entropy'], 4)} |"
        )
    return lines


def dips_md(matched: list[dict]) -> list[str]:
    lines = [
        "| arm | seed | criterion | fired | onset | refit before | its lower move | size "
        "| new lower bound | capped | steps from its first touched rollout to onset "
        "| abs(move) mid-rank in pair | level mid-rank in pair | level mid-rank, same step "
        "| pair's refits of that size |",
        "|---" * 15 + "|",
    ]
    for d in matched:
        head = f"| {d['arm']} | {d['seed']} | {d['criterion']} | {d['fired']} | {d['onset']} "
        r = d["refit"]
        if r is None:
            lines.append(head + "| none |" + " - |" * 9)
            continue
        lines.append(
            head + f"| {r['step']} | {r['lower_move']:+.3f} | {r['lower_size']} "
            f"| {r['lower_new']:.3f} | {'yes' if r['lower_capped'] else 'no'} "
            f"| {r['steps_after']} | {r['move_rank']:.2f} | {r['level_rank']:.2f} "
            f"| {r['level_rank_same_step']:.2f} "
            f"| {r['same_size_share']:.2f} |"
        )
    return lines


def to_md(r: dict) -> str:
    k, lag = r["k"], r["lag"]
    pairs = ", ".join(f"`{a}` - `{v}` ({r['runs'][a]} seeds)" for a, v in r["pairs"].items())
    lines = [
        f"Refit at step s; Δ = mean over steps s{lag:+d}..s{lag + k - 1:+d} minus mean over steps "
        f"s{lag - k:+d}..s{lag - 1:+d} (K = {k}); paired = CC minus its seed-paired vanilla run at "
        f"the same steps; mean ± SE over refits (refits of one run are not independent). "
        f"Pairs: {pairs}. Degradations from `{r['verdict']}`.",
        "",
    ]
    titles = {
        "pair": "pair",
        "lower_size": "lower-bound move",
        "upper_size": "upper-bound move",
        "lower_level": "new lower bound",
    }
    for field, title in titles.items():
        for scope, rows in r["groups"][field].items():
            lines += [f"**By {title}, {scope}**", "", *group_md(rows, title), ""]
    lines += ["**Placebo: the same paired change halfway between refits (no bound moves)**", ""]
    lines += ["| pair | windows | Δ reward CC - vanilla | Δ entropy CC - vanilla |"]
    lines += ["|---|---|---|---|"]
    for arm, p in r["placebo"].items():
        lines.append(f"| {arm} | {p['n']} | {_pm(p['reward'])} | {_pm(p['entropy'], 4)} |")
    lines += [
        "",
        "**Degradations of the CC runs and the refit before each**",
        "",
        *dips_md(r["dips"]),
    ]
    d = r["dip_summary"]
    if d["with_refit"]:
        lines += [
            "",
            f"{d['with_refit']} of {d['dips']} degradations have a refit before them; "
            f"{d['after_full_step']} follow a full-step lower move "
            f"({d['after_full_step_by_chance']:.1f} expected were it any refit of the pair); mean "
            f"mid-ranks (0.5 by chance): |move| {d['mean_move_rank']:.2f}, level "
            f"{d['mean_level_rank']:.2f}, level among the pair's runs at the same step "
            f"{d['mean_level_rank_same_step']:.2f}.",
        ]
    if r["left_out"]:
        lines += ["", f"Left out (window past the run's end): {r['left_out']}"]
    return "\n".join(lines)


def plot(path: Path, r: dict) -> Path:
    """Paired Δ reward and Δ entropy against the lower bound's move, one point per refit, the
    refits before a degradation ringed; seeds spread a little along x (moves repeat)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before_dip = {(d["arm"], d["seed"], d["refit"]["step"]) for d in r["dips"] if d["refit"]}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, name in zip(axes, METRICS, strict=True):
        for arm, colour in zip(r["pairs"], ("tab:blue", "tab:red", "tab:green"), strict=False):
            ev = [e for e in r["events"] if e["arm"] == arm]
            xs = [e["lower_move"] + 0.002 * (e["seed"] - 2) for e in ev]
            ax.scatter(xs, [e[name] for e in ev], s=14, color=colour, alpha=0.6, label=arm)
            ringed = [
                (x, e[name])
                for x, e in zip(xs, ev, strict=True)
                if (arm, e["seed"], e["step"]) in before_dip
            ]
            if ringed:
                ax.scatter(
                    *zip(*ringed, strict=True),
                    s=120,
                    facecolors="none",
                    edgecolors="black",
                    label=f"{arm}: refit before a degradation",
                )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("lower bound's move at the refit (new - old)")
        ax.set_ylabel(f"Δ {name}, CC - vanilla (K = {r['k']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.refit_events")
    p.add_argument("out", help="the finished sweep's folder (spec.json, runs, verdict)")
    p.add_argument("--to", help="where refit-events.{json,md,png} go (default: OUT)")
    p.add_argument("--verdict", default="verdict-matched.json", help="the verdict file in OUT")
    p.add_argument("--k", type=int, default=K, help="steps on each side of a refit")
    a = p.parse_args(argv)
    to = Path(a.to or a.out)
    try:
        result = compute(a.out, a.verdict, a.k)
        text = to_md(result)
        write_report(to, "refit-events", result, text)
        plot(to / "refit-events.png", result)
    except (Fp8rlError, OSError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
