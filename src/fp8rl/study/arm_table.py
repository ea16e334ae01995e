"""The study table of a finished sweep: each arm's mean +- SE over seeds, and its difference
from a reference arm paired by seed (arms of one seed share the warm start, the prompts and
the sampling seeds, so the seed-to-seed spread cancels in the difference).

    python -m fp8rl.study.arm_table runs/study [--ref bf16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .sweep_stats import summarize_seeds

# (label, where in an arm's aggregate, key, scale, digits)
ROWS = (
    ("reward, last 10 steps", "final", "reward_final", 1.0, 3),
    ("greedy test accuracy, end", "final", "eval_final_mean@1", 1.0, 3),
    ("rollout entropy (nats/token)", "metrics", "rollout/entropy", 1.0, 4),
    ("response length (tokens)", "metrics", "rollout/response_len", 1.0, 1),
    (
        "lower clips of N, FP8 or noised ratio (%)",
        "metrics",
        "shadow/lower_clipfrac_neg_fp8",
        100.0,
        2,
    ),
    ("lower clips of N, BF16 shadow (%)", "metrics", "shadow/lower_clipfrac_neg_bf16", 100.0, 2),
    ("lower-clip excess (pp)", "metrics", "shadow/lower_clip_excess", 100.0, 2),
    (
        "high-entropy share of lower clips",
        "metrics",
        "shadow/high_entropy_lower_clip_share",
        1.0,
        2,
    ),
    ("token log-ratio error sd (1e-4)", "metrics", "shadow/logratio_err_sd", 1e4, 1),
    # GSPO's sequence ratios (loss.mode gspo, gspo_calibrated): negative-advantage responses
    (
        "lower clips of N responses, FP8 (%)",
        "metrics",
        "shadow/seq_lower_clipfrac_neg_fp8",
        100.0,
        2,
    ),
    (
        "lower clips of N responses, BF16 shadow (%)",
        "metrics",
        "shadow/seq_lower_clipfrac_neg_bf16",
        100.0,
        2,
    ),
    ("sequence lower-clip excess (pp)", "metrics", "shadow/seq_lower_clip_excess", 100.0, 2),
    ("sequence log-ratio error sd (1e-4)", "metrics", "shadow/seq_logratio_err_sd", 1e4, 2),
    ("log-prob error sd S", "metrics", "shadow/logprob_err_sd", 1.0, 4),
    ("old/new error correlation C", "metrics", "shadow/old_new_err_corr", 1.0, 2),
)


def _per_seed(arm: dict, where: str, key: str) -> list:
    return (arm.get(where, {}).get(key) or {}).get("per_seed") or []


def _fmt(stats: dict, scale: float, digits: int) -> str:
    m, se = stats.get("mean"), stats.get("se")
    if m is None:
        return "-"
    text = f"{m * scale:.{digits}f}"
    return text + (f" ± {se * scale:.{digits}f}" if se is not None else "")


def arm_table(agg: dict, ref: str = "bf16") -> str:
    arms = list(agg["arms"])
    head = "| | " + " | ".join(arms) + " |"
    lines = [head, "|---" * (len(arms) + 1) + "|"]
    for label, where, key, scale, digits in ROWS:
        cells = [
            _fmt(summarize_seeds(_per_seed(agg["arms"][a], where, key)), scale, digits)
            for a in arms
        ]
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if ref in agg["arms"]:
        lines += [
            "",
            f"Paired by seed, minus `{ref}`:",
            "",
            head.replace("| |", "| vs " + ref + " |"),
            lines[1],
        ]
        for label, where, key, scale, digits in ROWS[:4]:
            base = _per_seed(agg["arms"][ref], where, key)
            cells = []
            for a in arms:
                mine = _per_seed(agg["arms"][a], where, key)
                diffs = [x - y for x, y in zip(mine, base) if x is not None and y is not None]
                cells.append("-" if a == ref else _fmt(summarize_seeds(diffs), scale, digits))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.arm_table")
    p.add_argument("out", help="a finished sweep's folder (holds aggregate.json)")
    p.add_argument("--ref", default="bf16", help="the arm differences are paired against")
    a = p.parse_args(argv)
    path = Path(a.out) / "aggregate.json"
    if not path.is_file():
        p.error(f"{path} not found: run `fp8rl sweep` first")
    print(arm_table(json.loads(path.read_text()), a.ref))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
