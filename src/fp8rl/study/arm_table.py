"""The study table of a finished sweep: each arm's mean +- SE over seeds, and its difference
from a reference arm paired by seed (arms of one seed share the warm start, the prompts and
the sampling seeds, so the seed-to-seed spread cancels in the difference).

    python -m fp8rl.study.arm_table runs/study [--ref bf16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import Fp8rlError, one_line
from ..utils import run_main
from .run_checks import IncompleteRunsError, complete_runs, read_json
from .sweep.aggregation import aggregate_runs
from .sweep.spec import SPEC_FILE, load_spec
from .sweep.stats import finite, summarize_seeds

PAIRED_SEEDS = 2  # a paired difference's standard error needs two seeds

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


def _per_seed(agg: dict, arm: str, where: str, key: str) -> list:
    """The arm's per-seed values of a row: all of its seeds', or [] where the arm does not log
    it; a seed missing among the others is an error (its mean would stand for fewer seeds)."""
    seeds = agg["arms"][arm].get("seeds") or []
    values = (agg["arms"][arm].get(where, {}).get(key) or {}).get("per_seed") or []
    if all(finite(v) is None for v in values):
        return []
    if len(values) != len(seeds) or any(finite(v) is None for v in values):
        # not strict: values may be shorter than seeds, and the seeds past its end are missing
        missing = [s for s, v in zip(seeds, values, strict=False) if finite(v) is None]
        missing = missing or seeds[len(values) :]
        raise IncompleteRunsError(
            f"arm {arm}: {key} has no value for seed(s) {missing} of {seeds}; no table"
        )
    return values


def _fmt(stats: dict, scale: float, digits: int) -> str:
    m, se = stats.get("mean"), stats.get("se")
    if m is None:
        return "-"
    text = f"{m * scale:.{digits}f}"
    return text + (f" ± {se * scale:.{digits}f}" if se is not None else "")


def _paired(agg: dict, arm: str, ref: str, base: list, row: tuple) -> dict:
    """The seed-paired differences arm - ref of a row; the arms must share their seeds."""
    mine = _per_seed(agg, arm, *row)
    if not mine or not base:
        return {}
    if agg["arms"][arm].get("seeds") != agg["arms"][ref].get("seeds"):
        raise IncompleteRunsError(f"arm {arm} and {ref} have other seeds: no pairing; no table")
    return summarize_seeds([x - y for x, y in zip(mine, base, strict=True)])


def _paired_lines(agg: dict, ref: str, head: str, rule: str) -> list[str]:
    seeds = agg["arms"][ref].get("seeds") or []
    if len(seeds) < PAIRED_SEEDS:
        need = f"a paired difference needs at least {PAIRED_SEEDS}"
        return [f"Paired by seed, minus `{ref}`: no verdict, {len(seeds)} seed(s); {need}."]
    lines = [f"Paired by seed, minus `{ref}`:", "", head.replace("| |", f"| vs {ref} |"), rule]
    for label, where, key, scale, digits in ROWS[:4]:
        base = _per_seed(agg, ref, where, key)
        cells = [
            "-" if a == ref else _fmt(_paired(agg, a, ref, base, (where, key)), scale, digits)
            for a in agg["arms"]
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def arm_table(agg: dict, ref: str = "bf16") -> str:
    arms = list(agg["arms"])
    head = "| | " + " | ".join(arms) + " |"
    lines = [head, "|---" * (len(arms) + 1) + "|"]
    for label, where, key, scale, digits in ROWS:
        cells = [_fmt(summarize_seeds(_per_seed(agg, a, where, key)), scale, digits) for a in arms]
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    notes = [
        f"- `{a}`: {n} step(s) of {key} logged no finite value, left out of its means."
        for a in arms
        for key, n in agg["arms"][a].get("nonfinite_steps", {}).items()
    ]
    lines += ["", *notes] if notes else []
    if ref in agg["arms"]:
        lines += ["", *_paired_lines(agg, ref, head, lines[1])]
    else:  # said, not dropped silently
        lines += ["", f"Not paired: no arm `{ref}` to pair against (--ref names one of {arms})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.arm_table")
    p.add_argument(
        "out", help="a finished sweep's folder (aggregate.json), or committed raw runs (spec.json)"
    )
    p.add_argument("--ref", default=None, help="the arm differences are paired against (bf16)")
    a = p.parse_args(argv)
    path, spec_path = Path(a.out) / "aggregate.json", Path(a.out) / SPEC_FILE
    if not path.is_file() and not spec_path.is_file():
        p.error(f"{path} not found: run `fp8rl sweep` first")
    try:
        if spec_path.is_file():  # the runs behind it, checked as they are now
            complete_runs(a.out, load_spec(spec_path), ("rollout/reward",))
        # committed raw runs carry no aggregate: computed from them, nothing written
        agg = read_json(path) if path.is_file() else aggregate_runs(spec_path, a.out)
        if a.ref is not None and a.ref not in agg["arms"]:
            raise IncompleteRunsError(f"--ref {a.ref!r}: no such arm; arms: {list(agg['arms'])}")
        text = arm_table(agg, a.ref or "bf16")
    except (Fp8rlError, OSError) as e:
        p.error(one_line(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
