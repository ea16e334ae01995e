"""One RL step's cost by part on the real model (SmolLM2-135M-Instruct), in wall and CPU seconds.

Three arms of configs/real-model.yaml, built once and stepped in turn (interleaved), so machine
load falls on all of them alike:
  fp32       rollout and training in float32 (the CPU's high precision)
  fp8        rowwise FP8 rollout and training, PPO clip at the nominal bounds, no shadow passes
  fp8+cc     the same with Calibrated Clipping, its BF16 shadow passes and refit every step
Each arm takes one untimed warm-up step, then --steps timed ones; the table shows the median
per part (rollout, reward, old log-probs, update, calibrate, the step, and a checkpoint save
timed after each step) and each arm's ratio to fp32. The BF16 shadow passes run inside
`old_log_probs` and `update` at shadow steps, so their cost is fp8+cc's two minus fp8's;
`calibrate` is the refit. Wall
seconds on a shared machine also measure the neighbours: the CPU seconds (all threads of this
process) are the figure to compare across machines.

    python bench/real_model_costs.py --out docs/real-model/costs   # .md and .json
    python bench/real_model_costs.py --smoke --steps 1            # 2 x 2 responses of 4 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.config import load_config
from fp8rl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "real-model.yaml"
SHADOW_PARTS = ("old_log_probs", "update")  # where the shadow passes run
PHASES = ("rollout", "reward", "old_log_probs", "update", "calibrate", "step")
ARMS = {
    "fp32": [  # `bf16` is the master dtype: float32 (model.dtype) on the CPU
        "rollout.precision=bf16",
        "train.precision=bf16",
        "loss.mode=grpo",
    ],
    "fp8": ["loss.mode=grpo"],
    "fp8+cc": ["loss.mode=calibrated", "calibration.interval=1"],
}
COMMON = ["log.progress=false", "log.eval_every=0", "log.checkpoint_every=0", "train.steps=100"]
SMOKE = ["rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4"]


def build(out: Path, smoke: bool) -> dict[str, Trainer]:
    trainers = {}
    for arm, overrides in ARMS.items():
        extra = [f"log.out_dir={out / arm}", *COMMON, *overrides, *(SMOKE if smoke else [])]
        trainers[arm] = Trainer(load_config(CONFIG, extra), progress=False)
    return trainers


def timed_save(trainer: Trainer) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.save()
    return time.perf_counter() - t0, time.process_time() - c0


def measure(trainers: dict[str, Trainer], steps: int) -> dict[str, list[dict]]:
    for t in trainers.values():
        t.run(1)  # warm-up: first-call allocations, lazy imports
    rows = {arm: [] for arm in trainers}
    for i in range(steps):
        for arm, t in trainers.items():
            print(f"[costs] step {i + 1}/{steps}: {arm}", file=sys.stderr, flush=True)
            row = t.run(1)[0]
            wall, cpu = timed_save(t)
            part = {p: row.get(f"time/{p}", 0.0) for p in PHASES}
            part |= {f"cpu_{p}": row.get(f"time/cpu_{p}", 0.0) for p in PHASES}
            rows[arm].append(part | {"checkpoint": wall, "cpu_checkpoint": cpu})
    return rows


def medians(rows: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {
        arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for arm, rs in rows.items()
    }


def table(med: dict[str, dict[str, float]], kind: str) -> str:
    prefix = "cpu_" if kind == "CPU" else ""
    arms = list(med)
    lines = [
        f"| part ({kind} s, median) | " + " | ".join(arms) + " | fp8 / fp32 | fp8+cc / fp32 |",
        "|---" * (len(arms) + 3) + "|",
    ]
    for p in (*PHASES, "checkpoint"):
        v = [med[a][prefix + p] for a in arms]
        ratios = [f"{x / v[0]:.2f}x" if v[0] > 1e-3 else "-" for x in v[1:]]
        lines.append(
            f"| {p} | " + " | ".join(f"{x:.2f}" for x in v) + " | " + " | ".join(ratios) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    ap.add_argument("--smoke", action="store_true", help="tiny batches: checks the script")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="fp8rl-costs-") as tmp:
        trainers = build(Path(tmp), a.smoke)
        cfg = trainers["fp32"].cfg
        rows = measure(trainers, a.steps)
        del trainers
    med = medians(rows)
    shape = f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.n} responses, "
    shape += (
        f"up to {cfg.rollout.max_new_tokens} new tokens, {cfg.train.mini_batches} mini-batch(es)"
    )
    head = (
        f"configs/real-model.yaml ({shape}); {a.steps} timed steps per arm after a warm-up, "
        f"arms interleaved; torch {torch.__version__}, {a.threads} threads, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    shadow = sum(med["fp8+cc"][f"cpu_{p}"] - med["fp8"][f"cpu_{p}"] for p in SHADOW_PARTS)
    text = "\n\n".join(
        [
            head,
            table(med, "CPU"),
            table(med, "wall"),
            f"Shadow passes (fp8+cc minus fp8, old_log_probs + update): {shadow:.2f} CPU s "
            "per shadow step.",
        ]
    )
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        record = {"header": head, "steps": a.steps, "threads": a.threads, "rows": rows}
        a.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
