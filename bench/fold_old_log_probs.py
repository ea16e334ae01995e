"""What `train.fold_old_log_probs` saves on the real model (SmolLM2-135M-Instruct), by part.

Two arms of configs/real-model.yaml in float32 (rollout and training), loss mode grpo, no TIS,
one mini-batch a step, built once and stepped in turn (interleaved), so machine load falls
on both alike:
  recompute   the no-grad old-log-prob pass before the update (the default)
  fold        train.fold_old_log_probs: the update forward's own log-probs, detached
Each arm takes one untimed warm-up step, then --steps timed ones; the table shows the median
CPU and wall seconds per part and the fold arm's ratio to recompute. Wall seconds on a shared
machine also measure the neighbours: the CPU seconds (all threads of this process) are the
figure to compare.

    python bench/fold_old_log_probs.py --out docs/real-model/fold   # .md and .json
    python bench/fold_old_log_probs.py --smoke --steps 1           # 2 x 2 responses of 4 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.config import load_config
from fp8rl.train.trainer import Trainer
from fp8rl.utils import atomic_write_text
from real_model_costs import COMMON, CONFIG, ROOT, SMOKE, medians

PHASES = ("rollout", "reward", "old_log_probs", "update", "step")
BASE = [
    "rollout.precision=fp32",
    "train.precision=fp32",
    "loss.mode=grpo",
    "loss.tis=false",
    "train.mini_batches=1",
]
ARMS = {"recompute": [], "fold": ["train.fold_old_log_probs=true"]}
FOLDED = "train/old_log_probs_folded"


def build(out: Path, args) -> dict[str, Trainer]:
    shape = [f"rollout.prompts_per_step={args.prompts}", f"rollout.n={args.n}"]
    shape += [f"model.source={args.model}"] + (SMOKE if args.smoke else [])
    return {
        arm: Trainer(
            load_config(CONFIG, [f"log.out_dir={out / arm}", *COMMON, *BASE, *extra, *shape]),
            progress=False,
        )
        for arm, extra in ARMS.items()
    }


def measure(trainers: dict[str, Trainer], steps: int) -> dict[str, list[dict]]:
    for t in trainers.values():
        t.run(1)  # warm-up: first-call allocations, lazy imports
    rows = {arm: [] for arm in trainers}
    for i in range(steps):
        for arm, t in trainers.items():
            print(f"[fold] step {i + 1}/{steps}: {arm}", file=sys.stderr, flush=True)
            row = t.run(1)[0]
            part = {p: row.get(f"time/{p}", 0.0) for p in PHASES}
            part |= {f"cpu_{p}": row.get(f"time/cpu_{p}", 0.0) for p in PHASES}
            rows[arm].append(part | {"folded": row.get(FOLDED, 0.0)})
    return rows


def table(med: dict[str, dict[str, float]], kind: str) -> str:
    prefix = "cpu_" if kind == "CPU" else ""
    lines = [f"| part ({kind} s, median) | recompute | fold | fold / recompute |", "|---" * 4 + "|"]
    for p in PHASES:
        a, b = med["recompute"][prefix + p], med["fold"][prefix + p]
        ratio = f"{b / a:.2f}x" if a > 1e-3 else "-"
        lines.append(f"| {p} | {a:.2f} | {b:.2f} | {ratio} |")
    return "\n".join(lines)


def report(med, cfg, args) -> str:
    shape = (
        f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.n} responses, up to "
        f"{cfg.rollout.max_new_tokens} new tokens, fp32, loss grpo, no TIS, 1 mini-batch"
    )
    head = (
        f"configs/real-model.yaml ({shape}); {args.steps} timed steps per arm after a warm-up, "
        f"arms interleaved; torch {torch.__version__}, {args.threads} thread(s), "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    if args.note:
        head += f". {args.note}"
    a, b = med["recompute"]["cpu_step"], med["fold"]["cpu_step"]
    saved = (
        f"Folding saves {a - b:.2f} CPU s of a {a:.2f} CPU s step ({(a - b) / a:.0%}); the "
        f"recomputed old-log-prob pass was {med['recompute']['cpu_old_log_probs'] / a:.0%} of "
        f"it. Steps folded: recompute {med['recompute']['folded']:.0f}, fold "
        f"{med['fold']['folded']:.0f} (train/old_log_probs_folded, median)."
    )
    return "\n\n".join([head, table(med, "CPU"), table(med, "wall"), saved])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--prompts", type=int, default=4, help="prompts a step")
    ap.add_argument("--n", type=int, default=4, help="responses a prompt")
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--note", default="", help="a sentence for the header (e.g. the load)")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    ap.add_argument("--smoke", action="store_true", help="tiny batches: checks the script")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fp8rl-fold-") as tmp:
        trainers = build(Path(tmp), args)
        cfg = trainers["recompute"].cfg
        rows = measure(trainers, args.steps)
        del trainers
    med = medians(rows)
    text = report(med, cfg, args)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out.with_suffix(".md"), text + "\n")
        record = {"header": text.split("\n\n")[0], "steps": args.steps, "rows": rows}
        atomic_write_text(args.out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
