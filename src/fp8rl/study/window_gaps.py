"""When does an arm leave BF16's track? Seed-paired gaps by window of steps, and the gaps
between two arms of a pair (calibrated - vanilla, oracle - vanilla) over the last window.

    python -m fp8rl.study.window_gaps runs/study-matched                  # every arm vs bf16
    python -m fp8rl.study.window_gaps runs/study-matched --pair matched-calibrated:matched

Per seed, the mean of the metric over the window's steps in arm A minus the same in arm B
(the arms of a seed share the warm start, prompt order and sampling seeds), then the mean
and 95 % Student-t interval over seeds. A gap that grows window by window is a drift (the
paper's surge grows after about 100 steps); one that is there from the first window is a
level shift. Every run must be finished and log the metrics at every step, or nothing is
concluded and nothing is written (study/run_checks.py).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..errors import Fp8rlError
from ..utils import run_main
from .run_checks import complete_runs, enough, sweep_spec
from .sweep.stats import summarize_seeds, write_report

METRICS = {"rollout/entropy": "entropy (nats/token)", "rollout/reward": "reward"}


def _window_mean(rows: list[dict], key: str, lo: int, hi: int) -> float:
    vals = [r[key] for r in rows if lo <= r["step"] < hi]
    return math.fsum(vals) / len(vals)


def gap(runs: dict, a: str, b: str, key: str, lo: int, hi: int) -> dict:
    """Seed-paired a - b of `key`'s mean over steps lo..hi-1 (STATS over the shared seeds)."""
    seeds = sorted(set(runs[a]) & set(runs[b]))
    return summarize_seeds(
        [
            _window_mean(runs[a][s], key, lo, hi) - _window_mean(runs[b][s], key, lo, hi)
            for s in seeds
        ]
    )


def _checked_arms(runs: dict, ref: str, pairs: list[tuple[str, str]]) -> None:
    named = [ref, *(x for p in pairs for x in p)]
    missing = sorted({x for x in named if x not in runs})
    if missing:
        raise Fp8rlError(f"no arm {', '.join(missing)} in the sweep (arms: {', '.join(runs)})")


def window_gaps(out_dir, ref: str = "bf16", window: int = 50, pairs=()) -> dict:
    out = Path(out_dir)
    spec = sweep_spec(out)
    runs = complete_runs(out, spec, tuple(METRICS))
    _checked_arms(runs, ref, list(pairs))
    # a gap of one seed has no interval: the table would show a number with nothing to weigh
    enough(out, spec, runs, "a seed-paired gap", 2, 1, "one step")
    steps = min(len(rows) for seeds in runs.values() for rows in seeds.values())
    if window < 1 or steps < window:
        raise Fp8rlError(f"--window {window}: must be 1..{steps} (the runs' steps)")
    edges = [(lo, lo + window) for lo in range(0, steps - window + 1, window)]
    by_window = {
        key: {
            arm: [gap(runs, arm, ref, key, lo, hi) for lo, hi in edges]
            for arm in runs
            if arm != ref
        }
        for key in METRICS
    }
    last = edges[-1]
    pair_gaps = {
        f"{a} - {b}": {key: gap(runs, a, b, key, *last) for key in METRICS} for a, b in pairs
    }
    return {"ref": ref, "windows": edges, "by_window": by_window, "pairs": pair_gaps}


def _cell(s: dict, digits: int = 3) -> str:
    if s["mean"] is None:
        return "-"
    if s["ci95"] is None:
        return f"{s['mean']:+.{digits}f}"
    lo, hi = s["ci95"]
    return f"{s['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def window_gaps_md(result: dict) -> str:
    heads = " | ".join(f"steps {lo}-{hi - 1}" for lo, hi in result["windows"])
    lines = []
    for key, what in METRICS.items():
        lines += [
            f"Δ {what} against {result['ref']}, paired by seed (mean [95 % interval]):",
            "",
            f"| arm | {heads} |",
            "|---" * (len(result["windows"]) + 1) + "|",
        ]
        for arm, gaps in result["by_window"][key].items():
            lines.append(f"| {arm} | " + " | ".join(_cell(g) for g in gaps) + " |")
        lines.append("")
    if result["pairs"]:
        lo, hi = result["windows"][-1]
        heads = " | ".join(f"Δ {what}" for what in METRICS.values())
        lines += [f"Between arms, steps {lo}-{hi - 1}:", "", f"| pair | {heads} |", "|---|---|---|"]
        for name, g in result["pairs"].items():
            lines.append(f"| {name} | " + " | ".join(_cell(g[k]) for k in METRICS) + " |")
    return "\n".join(lines).rstrip()


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ARM_A:ARM_B")
    return a, b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.window_gaps")
    p.add_argument("out", help="the finished sweep's folder")
    p.add_argument("--ref", default="bf16", help="the arm every other is paired against")
    p.add_argument("--window", type=int, default=50, help="steps per window (default 50)")
    p.add_argument("--pair", type=_pair, action="append", default=[], help="ARM_A:ARM_B")
    a = p.parse_args(argv)
    try:
        result = window_gaps(a.out, a.ref, a.window, a.pair)
        text = window_gaps_md(result)
        write_report(Path(a.out), "window_gaps", result, text)
    except (Fp8rlError, OSError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
