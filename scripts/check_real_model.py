"""Runs README.md's "A real pretrained model" commands as a new user would, then checks the run.

The commands are read from the README itself (its one bash block in that section), so the
README cannot drift from what CI runs. They run in a fresh bash with `.venv/bin` first on PATH,
the shell a user gets after `source .venv/bin/activate`. Then the run's step 1 must show a
Calibrated Clipping refit (`calib/updated == 1`) and an FP8-vs-fp32 shadow per-token
probability error (`shadow/nmae_prob`) in [0.03, 0.25]: 8-bit FP8 on this model is noisy
(about 9 % per token) but not broken. `--record FILE` writes what was measured.

Usage: python scripts/check_real_model.py [--record docs/real-model/check.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## A real pretrained model"
NMAE_RANGE = (0.03, 0.25)


def readme_commands(readme: Path) -> list[str]:
    text = readme.read_text(encoding="utf-8")
    start = text.find(SECTION)
    if start < 0:
        raise SystemExit(f"{readme}: no section {SECTION!r}")
    section = text[start + len(SECTION) :].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    if len(blocks) != 1:
        found = len(blocks)
        raise SystemExit(f"{readme}: {SECTION!r} must hold exactly one bash block, has {found}")
    lines = [ln.split(" #", 1)[0].strip() for ln in blocks[0].splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def run_folder(commands: list[str]) -> Path:
    for command in commands:
        words = shlex.split(command)
        if "train" in words and "--out" in words:
            return ROOT / words[words.index("--out") + 1]
    raise SystemExit("README's real-model block has no `fp8rl train ... --out RUN` command")


def step_one(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ones = [r for r in rows if r.get("step") == 1]
    if len(ones) != 1:
        raise SystemExit(f"{run}/metrics.jsonl: expected one row of step 1, found {len(ones)}")
    return ones[0]


def check(row: dict) -> list[str]:
    problems = []
    if row.get("calib/updated") != 1:
        problems.append(f"calib/updated is {row.get('calib/updated')!r}, expected 1")
    nmae = row.get("shadow/nmae_prob")
    lo, hi = NMAE_RANGE
    if not isinstance(nmae, (int, float)) or not math.isfinite(nmae) or not lo <= nmae <= hi:
        problems.append(f"shadow/nmae_prob is {nmae!r}, expected within [{lo}, {hi}]")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, help="write the measured values to this JSON file")
    args = ap.parse_args()
    commands = readme_commands(ROOT / "README.md")
    run = run_folder(commands)
    if run.exists():  # this check's own output from an earlier try; a run folder is never reused
        raise SystemExit(f"{run} exists: remove it first (it is this check's output)")
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    seconds = {}
    for command in commands:
        print(f"$ {command}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env)
        seconds[command] = round(time.perf_counter() - t0, 1)
        if done.returncode != 0:
            print(f"check-real-model: `{command}` exited {done.returncode}", file=sys.stderr)
            return 1
    row = step_one(run)
    problems = check(row)
    keys = ("calib/updated", "shadow/nmae_prob", "shadow/lower_clip_excess", "calib/next_lower")
    measured = {k: row.get(k) for k in keys}
    print(json.dumps({"step_1": measured, "seconds": seconds}, indent=1))
    if args.record and not problems:
        record = {"commands": commands, "step_1": measured, "wall_seconds": seconds}
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for p in problems:
        print(f"check-real-model: step 1: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
