"""Feasibility of a supervised warm start on chain_arithmetic (docs/tasks.md quotes its output).

    PYTHONPATH=src python scripts/chain_warmstart.py --steps 1500 --lr 3e-3 --batch 64

One CPU thread, the tiny Qwen3 (overrides with --tiny key=value), greedy accuracy on a slice
of the test split every --check-every steps and on the whole test split at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutEngine
from fp8rl.tasks import get_task
from fp8rl.train.evaluate import evaluate_policy
from fp8rl.train.warmstart import warm_start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default="+")
    ap.add_argument("--task-steps", type=int, default=4)
    ap.add_argument("--check-every", type=int, default=250)
    ap.add_argument("--check-size", type=int, default=100)
    ap.add_argument("--tiny", nargs="*", default=[], help="tiny Qwen3 overrides, key=int")
    args = ap.parse_args()
    # The machine is shared: one thread, as the time budget assumes.
    torch.set_num_threads(1)

    task = get_task("chain_arithmetic", ops=args.ops, steps=args.task_steps)
    tiny = {k: int(v) for k, v in (kv.split("=") for kv in args.tiny)}
    model = tiny_qwen3(vocab_size=task.vocab_size, seed=args.seed, **tiny)
    tok = task.tokenizer
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.config, name, getattr(tok, name))
        setattr(model.generation_config, name, getattr(tok, name))
    engine = RolloutEngine(model, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"args": vars(args), "params": n_params}), flush=True)

    t0 = time.perf_counter()
    eval_s = 0.0

    def check(step: int, loss: float) -> bool:
        nonlocal eval_s
        if step % args.check_every:
            return False
        e0 = time.perf_counter()
        acc = evaluate_policy(
            model,
            engine,
            task,
            split="test",
            limit=args.check_size,
            max_new_tokens=task.max_new_tokens,
        )
        eval_s += time.perf_counter() - e0
        print(
            json.dumps(
                {
                    "step": step,
                    "loss": round(loss, 4),
                    "train_s": round(time.perf_counter() - t0 - eval_s, 1),
                    "test_acc_slice": acc["eval/mean@1"],
                    "parsed": acc["eval/parsed_frac"],
                }
            ),
            flush=True,
        )
        return False

    losses = warm_start(
        model,
        tok,
        task.sft_examples("train"),
        steps=args.steps,
        batch_size=args.batch,
        lr=args.lr,
        seed=args.seed,
        should_stop=check,
    )
    train_s = time.perf_counter() - t0 - eval_s
    e0 = time.perf_counter()
    acc = evaluate_policy(model, engine, task, split="test", max_new_tokens=task.max_new_tokens)
    print(
        json.dumps(
            {
                "final": True,
                "steps": len(losses),
                "loss_final": losses[-1],
                "train_s": round(train_s, 1),
                "eval_s": round(time.perf_counter() - e0, 1),
                "test_acc": acc["eval/mean@1"],
                "parsed": acc["eval/parsed_frac"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
