"""Greedy accuracy and sampling entropy along a chain_arithmetic warm start (docs/study-long.md
quotes its output): why the long-horizon study's task writes its chains in any order.

    PYTHONPATH=src python scripts/warmstart_trajectory.py --order fixed --schedule 1200
    PYTHONPATH=src python scripts/warmstart_trajectory.py --order any --schedule 2400

One CPU thread, the tiny Qwen3 built as `model.warm_start: auto` builds it (warm_start.seed 0),
fp8rl.train.warmstart.warm_start (AdamW, batch 32, lr 3e-3, warmup + cosine over --schedule steps).
Every --check-every steps it prints one JSON line: the step, the training loss, greedy
accuracy on the first 128 train problems and one sample per prompt at temperature 1 on the
same problems: its mean token entropy and response length. --stop-at ends the run early
without changing the schedule.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fp8rl.config import config_from_dict
from fp8rl.rollout import RolloutEngine
from fp8rl.tasks import get_task
from fp8rl.train.build import build_model
from fp8rl.train.evaluate import evaluate_policy, sampled_entropy
from fp8rl.train.warmstart import warm_start
from fp8rl.utils import seed_everything


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--order", choices=("fixed", "any"), default="any")
    ap.add_argument("--task-steps", type=int, nargs=2, default=(2, 5), metavar=("MIN", "MAX"))
    ap.add_argument("--schedule", type=int, default=2400, help="warm_start.steps")
    ap.add_argument("--stop-at", type=int, default=None)
    ap.add_argument("--check-every", type=int, default=25)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the machine is shared
    lo, hi = args.task_steps
    options = {"digits": 2, "ops": "+", "steps": lo, "steps_max": hi, "order": args.order}
    cfg = config_from_dict(
        {
            "task": {"name": "chain_arithmetic", "options": options},
            "model": {"source": "tiny", "tiny": {"num_hidden_layers": args.layers}},
        }
    )
    task = get_task(cfg.task.name, **cfg.task.options)
    seed_everything(0)
    model, tok = build_model(cfg.model, task, torch.device("cpu"))
    engine = RolloutEngine(model, tok)
    t0 = time.perf_counter()

    def check(step: int, loss: float) -> bool:
        if step % args.check_every:
            return False
        acc = evaluate_policy(model, engine, task, split="train", limit=128, max_new_tokens=64)
        ent = sampled_entropy(model, engine, task, limit=128, max_new_tokens=64, seed=1)
        row = {
            "step": step,
            "loss": round(loss, 3),
            "greedy_accuracy": acc["eval/mean@1"],
            "entropy": round(ent["entropy"], 3),
            "response_len": round(ent["response_len"], 1),
            "sampled_accuracy": ent["accuracy"],
            "wall_s": round(time.perf_counter() - t0),
        }
        print(json.dumps(row), flush=True)
        return args.stop_at is not None and step >= args.stop_at

    examples = task.sft_examples("train")
    warm_start(
        model, tok, examples, steps=args.schedule, batch_size=32, lr=3e-3, seed=0, should_stop=check
    )


if __name__ == "__main__":
    main()
