"""Does a GRPO run learn? The rule of issue 44 on one run and two held-out evaluations.

    python -m fp8rl.study.learning RUN --before EVAL0.json --after EVAL1.json [--out DIR]

RUN is a run folder (metrics.jsonl, config.json; events.log for the resume marks); EVAL0 and
EVAL1 are `fp8rl eval --out` files of the start model and the trained one on the same problems
with the same k, temperature and seed. The run learns when both hold:
  reward   the mean of rollout/reward over the last 20 steps is >= 0.10 above steps 0-9;
  held-out accuracy (mean@k) rises by >= 8 points, its 95 % interval above 0: paired by
           problem, the mean of the per-problem differences of the share correct +- 1.96 SE.
The inputs are checked first: a missing or malformed file, or evaluations of different problems
or settings, is a one-line error (exit 2); a run short of its train.steps, or a step without a
finite reward, gives the numbers it can and "no verdict". Writes OUT/learning.json,
OUT/learning.md and OUT/learning.png (reward and entropy per step); OUT defaults to RUN.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from ..errors import DataError, Fp8rlError, one_line
from ..train.runlog import METRICS_FILE, read_metrics, readable_jsonl
from ..utils import atomic_write_text, json_safe

FIRST, LAST = 10, 20  # steps 0-9 against the last 20
REWARD_GAIN, ACCURACY_GAIN = 0.10, 0.08
Z95 = 1.96
SAME_SETTING = ("split", "k", "limit", "temperature", "seed", "max_new_tokens")
# what else moved, first 10 steps against the last 20 (not judged): a collapse to a template
# shows as entropy and distinct responses falling together
TRACKED = {
    "rollout/entropy": "entropy (nats/token)",
    "rollout/response_len": "response length (tokens)",
    "rollout/truncated_frac": "cut at max_new_tokens",
    "rollout/parsed_frac": "answer parsed",
}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


# ---------------------------------------------------------------- inputs


def read_eval(path) -> dict:
    """An `fp8rl eval --out` file, checked: its k and per problem an index and 0 <= correct <= k."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such evaluation file (fp8rl eval --out)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not readable JSON ({one_line(e)})") from None
    problems = data.get("problems") if isinstance(data, dict) else None
    k = data.get("k") if isinstance(data, dict) else None
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or not problems:
        raise DataError(f"{path}: needs an integer k >= 1 and a non-empty 'problems' list")
    for p in problems:
        ok = isinstance(p, dict) and isinstance(p.get("index"), int) and p.get("k") == k
        if not ok or not isinstance(p.get("correct"), int) or not 0 <= p["correct"] <= k:
            raise DataError(f"{path}: problem {p!r} needs an index, k = {k} and 0 <= correct <= k")
    return data


def paired_accuracy(before: dict, after: dict, names=("before", "after")) -> dict:
    """Held-out accuracy (share of samples correct) before and after, and the paired difference:
    the mean of per-problem differences, its SE and 95 % interval. The two evaluations must
    cover the same problems (index and question) under the same setting."""
    for key in SAME_SETTING:
        if before.get(key) != after.get(key):
            raise DataError(
                f"{names[0]} and {names[1]} differ in '{key}' "
                f"({before.get(key)!r} vs {after.get(key)!r}): not a paired comparison"
            )
    ids = [(p["index"], p.get("question")) for p in before["problems"]]
    if ids != [(p["index"], p.get("question")) for p in after["problems"]]:
        raise DataError(f"{names[0]} and {names[1]} hold different problems: not paired")
    if len(ids) < 2:
        raise DataError(f"{names[0]}: {len(ids)} problem, at least 2 for an interval")
    k = before["k"]
    a = [p["correct"] / k for p in before["problems"]]
    b = [p["correct"] / k for p in after["problems"]]
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    mean = _mean(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    se = sd / math.sqrt(len(diffs))
    return {
        "problems": len(ids),
        "k": k,
        "temperature": before.get("temperature"),
        "before": _mean(a),
        "after": _mean(b),
        "diff": mean,
        "se": se,
        "ci95": [mean - Z95 * se, mean + Z95 * se],
    }


def read_run(run_dir) -> tuple[list[dict], int | None, list[int]]:
    """The run's metric rows, its train.steps (None when config.json does not say) and the
    steps it was resumed at (events.log)."""
    run_dir = Path(run_dir)
    if readable_jsonl(run_dir / METRICS_FILE) is None:  # an export_runs copy holds the .gz
        raise DataError(f"{run_dir}: no metrics.jsonl (a run folder of fp8rl train)")
    rows = read_metrics(run_dir, quiet=True)
    try:
        steps = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["train"]["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        steps = None
    events = run_dir / "events.log"
    text = events.read_text(encoding="utf-8") if events.is_file() else ""
    resumes = [int(m) for m in re.findall(r"^step (\d+): resumed from", text, re.M)]
    return rows, steps if isinstance(steps, int) else None, resumes


def reward_change(rows: list[dict], steps: int | None) -> tuple[dict, str | None]:
    """Mean reward over steps 0-9 and over the last 20 steps; the reason there is no verdict
    (None: there is one)."""
    by_step = {r["step"]: r for r in rows}
    n = max(by_step) + 1 if by_step else 0
    if sorted(by_step) != list(range(n)):
        return {"steps": len(by_step)}, "the run's metrics skip steps"
    if n < FIRST + LAST:
        return {"steps": n}, f"{n} steps, fewer than {FIRST + LAST} (steps 0-9 and the last 20)"
    rewards = [by_step[s].get("rollout/reward") for s in range(n)]
    bad = [s for s, r in enumerate(rewards) if not _finite(r)]
    if bad:
        return {"steps": n}, f"step {bad[0]} has no finite rollout/reward"
    first, last = _mean(rewards[:FIRST]), _mean(rewards[-LAST:])
    out = {"steps": n, "first": first, "last": last, "gain": last - first}
    if steps is not None and n < steps:
        return out, f"the run stopped at step {n} of its {steps}"
    return out, None


def tracked_change(rows: list[dict], samples: list[dict]) -> dict:
    """TRACKED's means over steps 0-9 and the last 20, and the share of distinct texts among
    the logged samples (log.samples) of those steps; a metric missing or non-finite is left out."""
    n = len(rows)
    if n < FIRST + LAST:
        return {}
    out = {}
    for key in TRACKED:
        vals = [r.get(key) for r in rows]
        if all(_finite(v) for v in vals):
            out[key] = {"first": _mean(vals[:FIRST]), "last": _mean(vals[-LAST:])}
    first = [x["response"] for x in samples if x.get("step", n) < FIRST]
    last = [x["response"] for x in samples if n - LAST <= x.get("step", -1) < n]
    if first and last:
        out["distinct_samples"] = {
            "first": len(set(first)) / len(first),
            "last": len(set(last)) / len(last),
        }
    return out


def verdict(reward: dict, accuracy: dict, reason: str | None) -> dict:
    if reason is not None:
        return {"learns": None, "text": f"no verdict: {reason}"}
    ok_reward = reward["gain"] >= REWARD_GAIN
    ok_acc = accuracy["diff"] >= ACCURACY_GAIN and accuracy["ci95"][0] > 0
    if ok_reward and ok_acc:
        return {"learns": True, "text": "learns: both thresholds met"}
    missed = [
        *([f"reward gain {reward['gain']:+.3f} < +{REWARD_GAIN}"] if not ok_reward else []),
        *(
            [
                f"held-out {100 * accuracy['diff']:+.1f} points, interval "
                f"[{100 * accuracy['ci95'][0]:+.1f}, {100 * accuracy['ci95'][1]:+.1f}] "
                f"(needs >= +{100 * ACCURACY_GAIN:.0f} with the interval above 0)"
            ]
            if not ok_acc
            else []
        ),
    ]
    return {"learns": False, "text": "does not learn: " + "; ".join(missed)}


# ---------------------------------------------------------------- outputs


def report_text(result: dict) -> str:
    r, a, v = result["reward"], result["accuracy"], result["verdict"]
    lines = [f"run: {result['run']} ({r['steps']} steps; resumed at {result['resumed_at']})"]
    if "gain" in r:
        lines.append(
            f"reward (rollout/reward): steps 0-{FIRST - 1} {r['first']:.3f}, last {LAST} "
            f"{r['last']:.3f}, difference {r['gain']:+.3f} (threshold +{REWARD_GAIN})"
        )
    lines.append(
        f"held-out mean@{a['k']} at temperature {a['temperature']} on {a['problems']} problems: "
        f"before {a['before']:.3f}, after {a['after']:.3f}, paired difference "
        f"{100 * a['diff']:+.1f} points, 95 % interval [{100 * a['ci95'][0]:+.1f}, "
        f"{100 * a['ci95'][1]:+.1f}] (threshold +{100 * ACCURACY_GAIN:.0f}, interval above 0)"
    )
    for key, t in result.get("tracked", {}).items():
        name = TRACKED.get(key, "distinct logged responses (share)")
        lines.append(f"  {name}: steps 0-{FIRST - 1} {t['first']:.3f}, last {LAST} {t['last']:.3f}")
    lines.append(f"verdict: {v['text']}")
    return "\n".join(lines)


def plot_run(path, rows: list[dict], resumes: list[int]) -> Path:
    """Reward (each step and a 10-step running mean) and sampling entropy per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for ax, key, label in (
        (axes[0], "rollout/reward", "reward (share correct)"),
        (axes[1], "rollout/entropy", "entropy (nats/token)"),
    ):
        ys = [r.get(key) if _finite(r.get(key)) else float("nan") for r in rows]
        ax.plot(steps, ys, ".", alpha=0.4, label="each step")
        run = [
            _mean([y for y in ys[max(0, i - 9) : i + 1] if y == y] or [float("nan")])
            for i in range(len(ys))
        ]
        ax.plot(steps, run, "-", label="10-step running mean")
        for s in resumes:
            ax.axvline(s, color="grey", ls="--", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left")
    axes[1].set_xlabel("step" + (" (dashed: resumed)" if resumes else ""))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def learning(run_dir, before_path, after_path, out=None) -> dict:
    """Check the inputs, judge, write OUT/learning.{json,md,png}; returns the result."""
    before, after = read_eval(before_path), read_eval(after_path)
    accuracy = paired_accuracy(before, after, names=(str(before_path), str(after_path)))
    rows, steps, resumes = read_run(run_dir)
    reward, reason = reward_change(rows, steps)
    samples = read_metrics(run_dir, quiet=True, name="samples.jsonl")
    result = {
        "run": str(run_dir),
        "before": str(before_path),
        "after": str(after_path),
        "resumed_at": resumes,
        "reward": reward,
        "accuracy": accuracy,
        "tracked": tracked_change(rows, samples) if reason is None or "gain" in reward else {},
        "verdict": verdict(reward, accuracy, reason),
    }
    out = Path(out or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        plot_run(out / "learning.png", rows, resumes)
    atomic_write_text(out / "learning.json", json.dumps(json_safe(result), indent=1) + "\n")
    md = f"# Does the run learn?\n\n```\n{report_text(result)}\n```\n"
    if rows:
        md += "\n![reward and entropy per step](learning.png)\n"
    atomic_write_text(out / "learning.md", md)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.learning", description=__doc__)
    p.add_argument("run", metavar="RUN", help="run folder of fp8rl train")
    p.add_argument("--before", required=True, help="fp8rl eval --out file of the start model")
    p.add_argument("--after", required=True, help="fp8rl eval --out file of the trained model")
    p.add_argument("--out", help="output folder (default: RUN)")
    a = p.parse_args(argv)
    try:
        result = learning(a.run, a.before, a.after, a.out)
    except (Fp8rlError, OSError) as e:
        print(f"fp8rl.study.learning: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(report_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
