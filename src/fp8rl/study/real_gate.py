"""The real-model study's gate (docs/study-real.md, Step 1): the learning rate of the judged
runs, and the smallest effect their seeds can detect.

    python -m fp8rl.study.real_gate SWEEP [SWEEP ...] --before EVAL0.json --evals DIR --out OUT

Each SWEEP is a finished `fp8rl sweep` folder of fp32 runs (or its export_runs copy);
DIR/ARM/seed-S.json is the `fp8rl eval --k 8` file of run ARM/seed-S's last checkpoint and
EVAL0 the start model's, on the same problems with the same settings. A run passes when:
  learns   issue 44's rule (study/learning.py): reward over the last 20 steps at least 0.10
           above steps 0-9, and held-out mean@k up at least 8 points, its 95 % interval above 0;
  garble   rollout/malformed_frac over the last 20 steps at most 0.05 above steps 0-9;
  stable   no criterion of study/degradation.py fires (the band criteria skipped: no reference).
The rate is the largest whose seed-100 run passes, once seeds 101 and 102 at it both pass; if
one fails, the next smaller rate that passed on seed 100 is tried; if none, the study stops.
Power: the sd over the chosen rate's three seeds of reward and entropy over the last 20 steps,
times the effect (in sd) that a two-sided 5 % t test on n seed-paired differences finds with
80 % power, for n = 3 and 5; seeds 3 and 4 join the judged runs when n = 3's reward gap
exceeds 0.10. Writes OUT/gate.json and OUT/gate.md. An unfinished run, a missing evaluation,
a run not in fp32 or two runs of one (rate, seed) are one-line errors: no choice.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from ..errors import DataError, Fp8rlError, one_line
from ..utils import run_main
from .degradation import degradation
from .learning import FIRST, LAST, paired_accuracy, read_eval, reward_change, verdict
from .run_checks import IncompleteRunsError, complete_runs, read_json, sweep_spec
from .sweep.spec import run_dir
from .sweep.stats import detectable_effect, seed_mean, write_report

GARBLE_RISE = 0.05
FIRST_SEED, CONFIRM_SEEDS = 100, (101, 102)
POWER, ALPHA, SEED_COUNTS = 0.8, 0.05, (3, 5)
MAX_REWARD_GAP = 0.10  # above it at 3 seeds, seeds 3 and 4 join the judged runs
NEEDS = ("rollout/reward", "rollout/entropy", "rollout/malformed_frac", "rollout/response_len")


def _mean(xs) -> float:
    return math.fsum(xs) / len(xs)


def _windows(rows: list[dict], key: str) -> dict:
    values = [float(r[key]) for r in rows]
    first, last = _mean(values[:FIRST]), _mean(values[-LAST:])
    return {"first": first, "last": last, "change": last - first}


# ---------------------------------------------------------------- inputs


def _run_setting(folder: Path) -> float:
    """The run's learning rate from its resolved config.json, after checking it ran in fp32."""
    path = folder / "config.json"
    if not path.is_file():
        raise IncompleteRunsError(f"{path} not found: the gate reads each run's resolved config")
    data = read_json(path)
    for section in ("rollout", "train"):
        precision = (data.get(section) or {}).get("precision")
        if precision != "fp32":
            raise DataError(
                f"{path}: {section}.precision is {precision!r}; the gate judges fp32 runs only"
            )
    lr = (data.get("train") or {}).get("lr")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise DataError(f"{path}: no numeric train.lr ({lr!r})")
    return float(lr)


def read_runs(sweeps, evals: Path) -> dict:
    """{(lr, seed): {"run", "rows", "eval"}} of every run of the sweep folders, each finished
    with every step's reward, entropy, garble rate and response length finite
    (run_checks.complete_runs), and its evaluation file present."""
    runs: dict = {}
    for out in map(Path, sweeps):
        spec = sweep_spec(out)
        for arm, per_seed in complete_runs(out, spec, NEEDS).items():
            for seed, rows in per_seed.items():
                key = (_run_setting(run_dir(out, arm, seed)), seed)
                name = str(run_dir(out, arm, seed))
                if key in runs:
                    raise DataError(
                        f"{name} and {runs[key]['run']}: two runs of lr {key[0]:g}, seed "
                        f"{seed}; the gate needs one"
                    )
                path = Path(evals) / arm / f"seed-{seed}.json"
                if not path.is_file():
                    raise IncompleteRunsError(
                        f"{path}: no held-out evaluation of {name} (fp8rl eval --k 8 "
                        "--checkpoint RUN --out FILE); no choice"
                    )
                runs[key] = {"run": name, "rows": rows, "eval": path}
    if not runs:
        raise IncompleteRunsError("no runs in the sweep folders given; no choice")
    return runs


def cpu_hours(rows: list[dict]) -> float | None:
    """The run's CPU time (time/cpu_step summed; a resumed run's lost steps not counted): what
    the study's budget is planned in. None when a step did not log it."""
    times = [r.get("time/cpu_step") for r in rows]
    if not all(isinstance(t, (int, float)) and math.isfinite(t) for t in times):
        return None
    return math.fsum(times) / 3600


# ---------------------------------------------------------------- the rule


def judge_run(rows: list[dict], before: dict, after: dict, names=("before", "after")) -> dict:
    """One run against the three conditions of the module docstring."""
    reward, reason = reward_change(rows, len(rows))
    accuracy = paired_accuracy(before, after, names)
    learns = verdict(reward, accuracy, reason)
    garble = _windows(rows, "rollout/malformed_frac")
    trajectories = {
        "entropy": [r["rollout/entropy"] for r in rows],
        "reward": [r["rollout/reward"] for r in rows],
        "malformed_frac": [r["rollout/malformed_frac"] for r in rows],
    }
    fired = degradation(trajectories, None).fired
    failed = [
        *(["does not learn"] if not learns["learns"] else []),
        *([f"garble up {garble['change']:+.3f}"] if garble["change"] > GARBLE_RISE else []),
        *([f"degrades ({', '.join(fired)})"] if fired else []),
    ]
    return {
        "reward": reward,
        "accuracy": accuracy,
        "learns": learns,
        "garble": garble,
        "entropy": _windows(rows, "rollout/entropy"),
        "response_len": _windows(rows, "rollout/response_len"),
        "degraded": fired,
        "clipfrac_lower_neg": seed_mean(rows, "actor/clipfrac_lower_neg", skip_steps=1),
        "cpu_hours": cpu_hours(rows),
        "passes": not failed,
        "failed": failed,
    }


def choose_rate(passes: dict) -> dict:
    """The rule of the module docstring on {(lr, seed): passed}."""
    rates = sorted((lr for lr, seed in passes if seed == FIRST_SEED), reverse=True)
    rejected: list[float] = []

    def result(lr, status: str, text: str) -> dict:
        failed = ", ".join(f"{r:g}" for r in rejected)
        why = f" (a confirming seed failed at {failed})" if rejected else ""
        return {"lr": lr, "status": status, "text": text + why, "not_confirmed": rejected}

    if not rates:
        return result(None, "pending", f"no run of seed {FIRST_SEED} yet")
    for lr in rates:
        if not passes[(lr, FIRST_SEED)]:
            continue
        confirm = {seed: passes.get((lr, seed)) for seed in CONFIRM_SEEDS}
        if all(confirm.values()):
            return result(lr, "chosen", f"lr {lr:g}: passes on seeds 100-102")
        if False not in confirm.values():
            missing = [s for s, ok in confirm.items() if ok is None]
            text = f"lr {lr:g} passes on seed {FIRST_SEED}; run seeds {missing} at it"
            return result(lr, "pending", text)
        rejected.append(lr)
    return result(None, "stop", "no learning rate passes: the study stops here")


def power(judged: list[dict]) -> dict:
    """The smallest seed-paired gaps of reward and entropy (last 20 steps) the judged seeds
    detect, from the spread of the chosen rate's gate seeds."""
    sd = {key: statistics.stdev(j[key]["last"] for j in judged) for key in ("reward", "entropy")}
    effects = {n: detectable_effect(n, POWER, ALPHA) for n in SEED_COUNTS}
    gaps = {
        n: {key: effects[n] * value for key, value in sd.items()} | {"effect_sd": effects[n]}
        for n in SEED_COUNTS
    }
    seeds = SEED_COUNTS[0] if gaps[SEED_COUNTS[0]]["reward"] <= MAX_REWARD_GAP else SEED_COUNTS[-1]
    return {"sd": sd, "detectable": gaps, "judged_seeds": seeds}


def gate(sweeps, before_path, evals) -> dict:
    """Read and check everything, judge every run, choose the rate, state the power."""
    before = read_eval(before_path)
    runs = read_runs(sweeps, evals)
    judged = {}
    for key in sorted(runs):
        run = runs[key]
        after = read_eval(run["eval"])
        names = (str(before_path), str(run["eval"]))
        judged[key] = {"run": run["run"], "eval": str(run["eval"])} | judge_run(
            run["rows"], before, after, names
        )
    choice = choose_rate({key: j["passes"] for key, j in judged.items()})
    result = {
        "before": str(before_path),
        "runs": [{"lr": lr, "seed": seed} | j for (lr, seed), j in judged.items()],
        "choice": choice,
    }
    if choice["status"] == "chosen":
        seeds = (FIRST_SEED, *CONFIRM_SEEDS)
        result["power"] = power([judged[(choice["lr"], s)] for s in seeds])
    return result


# ---------------------------------------------------------------- the report


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _run_line(r: dict) -> str:
    rew, acc, gar = r["reward"], r["accuracy"], r["garble"]
    lo, hi = (100 * x for x in acc["ci95"])
    return (
        f"| {r['lr']:g} | {r['seed']} | {rew['first']:.3f} | {rew['last']:.3f} | "
        f"{rew['gain']:+.3f} | {100 * acc['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
        f"{gar['first']:.3f} | {gar['last']:.3f} | {r['entropy']['first']:.2f} -> "
        f"{r['entropy']['last']:.2f} | {r['response_len']['first']:.1f} -> "
        f"{r['response_len']['last']:.1f} | {', '.join(r['degraded']) or 'no'} | "
        f"{_fmt(r['clipfrac_lower_neg'], '.4f')} | {_fmt(r['cpu_hours'], '.2f')} | "
        f"{'passes' if r['passes'] else 'fails: ' + '; '.join(r['failed'])} |"
    )


def report_text(result: dict) -> str:
    lines = [
        "| lr | seed | reward 0-9 | reward last 20 | gain | held-out mean@8, points [95 %] "
        "| garble 0-9 | garble last 20 | entropy (nats) | length (tokens) | degrades "
        "| lower clips of neg. tokens | CPU-hours | gate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_run_line(r) for r in result["runs"]),
        "",
        f"Held-out evaluations against {result['before']}; thresholds: reward gain >= "
        f"+0.10, held-out >= +8 points with the interval above 0, garble rise <= {GARBLE_RISE}.",
        "",
        f"**Choice**: {result['choice']['text']}.",
    ]
    p = result.get("power")
    if p:
        lines += [
            "",
            f"**Power** (sd over seeds 100-102: reward {p['sd']['reward']:.4f}, entropy "
            f"{p['sd']['entropy']:.4f} nats): the smallest seed-paired gap found with "
            f"{100 * POWER:.0f} % power by a two-sided {100 * ALPHA:.0f} % t test",
            "",
            "| judged seeds | effect (sd) | reward gap | entropy gap (nats) |",
            "|---|---|---|---|",
            *(
                f"| {n} | {g['effect_sd']:.2f} | {g['reward']:.3f} | {g['entropy']:.3f} |"
                for n, g in p["detectable"].items()
            ),
            "",
            f"Judged seeds: {p['judged_seeds']} (seeds 3 and 4 join when 3 seeds' reward gap "
            f"exceeds {MAX_REWARD_GAP}).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.real_gate", description=__doc__)
    p.add_argument("sweeps", nargs="+", metavar="SWEEP", help="finished fp32 sweep folders")
    p.add_argument("--before", required=True, help="fp8rl eval --out file of the start model")
    p.add_argument("--evals", required=True, help="folder of ARM/seed-S.json evaluations")
    p.add_argument("--out", required=True, help="folder for gate.json and gate.md")
    a = p.parse_args(argv)
    try:
        result = gate(a.sweeps, a.before, a.evals)
        text = report_text(result)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        write_report(Path(a.out), "gate", result, text)
    except (Fp8rlError, OSError) as e:
        print(f"fp8rl.study.real_gate: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
