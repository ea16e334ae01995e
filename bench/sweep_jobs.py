"""Sweep parallelism on this machine: the same small sweep (the ablation study's setting,
bf16 and fp8 arms, 2 seeds, a few steps) run with different (--jobs, --threads), wall time
side by side. On 2 cores, 2 workers of 1 thread should beat 1 worker of 2 threads (the tiny
model's ops are too small to split), and 2 workers of 2 threads oversubscribe.

    python bench/sweep_jobs.py                    # jobs x threads in 1x1, 1x2, 2x1, 2x2
    python bench/sweep_jobs.py --steps 2 --settings 2x1,1x2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.study.sweep import run_sweep, usable_cores
from fp8rl.study.sweep.spec import load_spec

SPEC = Path(__file__).resolve().parents[1] / "configs" / "study.yaml"


def small_spec(steps: int, seeds: int) -> dict:
    spec = load_spec(SPEC)
    base = dict(spec.base)
    base["train"] = {**base["train"], "steps": steps}
    base["log"] = {**base["log"], "eval_size": 0, "checkpoint_every": 0}
    arms = {arm: spec.arms[arm] for arm in ("bf16", "fp8")}
    return {"base": base, "arms": arms, "seeds": list(range(seeds)), "skip_steps": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--settings", default="1x1,1x2,2x1,2x2", help="JOBSxTHREADS, comma-separated")
    args = ap.parse_args()
    spec = small_spec(args.steps, args.seeds)
    runs = 2 * args.seeds
    print(f"{usable_cores()} usable cores; {runs} runs of {args.steps} steps per setting")
    print(f"{'jobs x threads':<16}{'wall s':>10}{'runs/min':>10}")
    for setting in args.settings.split(","):
        jobs, threads = (int(v) for v in setting.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run_sweep(spec, Path(tmp) / "sweep", jobs=jobs, threads=threads, progress=False)
            wall = time.perf_counter() - t0
        print(f"{setting:<16}{wall:>10.1f}{runs / wall * 60:>10.2f}")


if __name__ == "__main__":
    main()
