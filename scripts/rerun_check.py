"""Rerun the first steps of a committed run from its resolved config.json and compare every
logged value with the committed metrics (metrics.jsonl or metrics.jsonl.gz), wall times aside.

    OMP_NUM_THREADS=1 python scripts/rerun_check.py docs/study-long/runs/fp8/seed-0 [--steps 3]

Exact equality is expected on the machine that made the run (one thread, the same torch);
elsewhere small differences are expected (docs/study-long.md says what was checked where).
Exit status 0 when every value matches, 1 otherwise (a value differs, or nothing was compared),
2 with one line when the run cannot be read (damaged config.json, done.json or rows; a committed
run without rows for the steps asked) or the rerun fails.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from fp8rl.errors import DataError, Fp8rlError, one_line
from fp8rl.study.run_checks import IncompleteRunsError, finished_run, read_json, run_steps
from fp8rl.study.sweep.spec import DONE_FILE
from fp8rl.train.runlog import read_metrics

SKIPPED = ("time/",)  # wall-clock values differ by nature


def differences(old: list[dict], new: list[dict], steps: int) -> list[str]:
    """One line per value of the first `steps` steps that differs (or is missing)."""
    out = []
    by_step = {r["step"]: r for r in new}
    for row in (r for r in old if r["step"] < steps):
        mine = by_step.get(row["step"])
        if mine is None:
            out.append(f"step {row['step']}: not rerun")
            continue
        for key, value in row.items():
            if key.startswith(SKIPPED):
                continue
            other = mine.get(key)
            same = other == value or (
                isinstance(value, float)
                and isinstance(other, float)
                and math.isnan(value)
                and math.isnan(other)
            )
            if not same:
                out.append(f"step {row['step']} {key}: committed {value!r}, rerun {other!r}")
    return out


def committed(run: Path, steps: int) -> tuple[dict, list[dict]]:
    """The run's config and its rows of the first `steps` steps, one per step: a finished run
    (done.json) checked whole by study/run_checks.py; else IncompleteRunsError."""
    cfg = read_json(run / "config.json")
    if not isinstance(cfg.get("log"), dict):
        raise DataError(f"{run / 'config.json'}: no log section; not a resolved run config")
    total = run_steps(run)
    if not 1 <= steps <= total:
        raise IncompleteRunsError(f"--steps {steps}: the run has {total} steps (1..{total})")
    if (run / DONE_FILE).is_file():
        return cfg, finished_run(run, total)[:steps]
    rows = {r["step"]: r for r in read_metrics(run, quiet=True)}
    lacking = [s for s in range(steps) if s not in rows]
    if lacking:
        raise IncompleteRunsError(f"{run}: no committed row for step {lacking[0]}; no check")
    return cfg, [rows[s] for s in range(steps)]


def rerun(cfg: dict, steps: int, tmp: Path) -> list[dict]:
    """The first `steps` steps trained again from the resolved config, only the length and the
    end-of-run outputs changed."""
    cfg["train"]["steps"] = steps
    cfg["log"].update(out_dir=str(tmp / "run"), checkpoint_every=0, eval_size=0)
    (tmp / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "fp8rl.cli", "train", "--config", str(tmp / "config.json")]
    done = subprocess.run(
        cmd + ["--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Fp8rlError(f"the rerun failed (exit {done.returncode}): {last}")
    return read_metrics(tmp / "run")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder with config.json and metrics.jsonl[.gz]")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(argv)
    run = Path(a.run)
    try:
        cfg, old = committed(run, a.steps)
        with tempfile.TemporaryDirectory() as tmp:
            new = rerun(cfg, a.steps, Path(tmp))
    except (Fp8rlError, OSError) as e:
        print(f"rerun_check: error: {one_line(e)}", file=sys.stderr)
        return 2
    diffs = differences(old, new, a.steps)
    values = sum(len([k for k in r if k != "step" and not k.startswith(SKIPPED)]) for r in old)
    print(f"{run}: {a.steps} steps rerun, {values} values, {len(diffs)} differ")
    for line in diffs[:20]:
        print("  " + line)
    if values == 0:
        print("  nothing was compared: no check", file=sys.stderr)
    return 1 if diffs or values == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
