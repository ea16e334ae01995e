"""Rerun the first steps of a committed run from its resolved config.json and compare every
logged value with the committed metrics (metrics.jsonl or metrics.jsonl.gz), wall times aside.

    OMP_NUM_THREADS=1 python scripts/rerun_check.py docs/study-long/runs/fp8/seed-0 [--steps 3]

Exact equality is expected on the machine that made the run (one thread, the same torch);
elsewhere small differences are expected (docs/study-long.md says what was checked where).
Exit status 0 when every value matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder with config.json and metrics.jsonl[.gz]")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    run = Path(a.run)
    cfg = json.loads((run / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        # the resolved config, with only the length and the end-of-run outputs changed
        cfg["train"]["steps"] = a.steps
        cfg["log"].update(out_dir=str(Path(tmp) / "run"), checkpoint_every=0, eval_size=0)
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        cmd = [
            sys.executable,
            "-m",
            "fp8rl.cli",
            "train",
            "--config",
            str(Path(tmp) / "config.json"),
        ]
        subprocess.run(cmd + ["--no-progress"], check=True, stdout=subprocess.DEVNULL)
        new = read_metrics(Path(tmp) / "run")
    diffs = differences(read_metrics(run), new, a.steps)
    values = sum(len([k for k in r if not k.startswith(SKIPPED)]) for r in new)
    print(f"{run}: {a.steps} steps rerun, {values} values, {len(diffs)} differ")
    for line in diffs[:20]:
        print("  " + line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
