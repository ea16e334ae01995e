"""Pass rates of arithmetic_qa variants on a real pretrained chat model, at temperature 1.

Loads a local Hugging Face folder (default models/smollm2-135m-instruct, which the real
model's conversion writes), prompts it through its chat template as a run does (task.chat),
samples with fp8rl's own rollout engine in fp32 (no FP8) and scores with the task's reward.
Each variant takes `--prompts` train problems x `--samples` responses; the standard error is
over the prompts' mean scores (samples of one prompt are not independent).

    python bench/real_model_tasks.py                  # writes docs/real-model/task-pass-rates.*
    python bench/real_model_tasks.py --smoke          # 2 prompts x 2 samples x 8 tokens
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.models import load_pretrained
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.tasks import chat_task, get_task, prompt_inputs, score_batch
from fp8rl.utils import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR = "You are a calculator. Reply with the result only."
# name -> (arithmetic_qa options, task.system_prompt)
VARIANTS = {
    "add-1digit": ({"ops": "+", "digits": 1}, "default"),
    "mul-1digit": ({"ops": "*", "digits": 1}, "default"),
    "addmul-1digit": ({"ops": "+*", "digits": 1}, "default"),
    "addmul-1digit-calculator": ({"ops": "+*", "digits": 1}, CALCULATOR),
    "add-2digit": ({"ops": "+", "digits": 2}, "default"),
}


def measure(model, tokenizer, name: str, args) -> dict:
    options, system = VARIANTS[name]
    task = chat_task(get_task("arithmetic_qa", **options), tokenizer, system_prompt=system)
    samples = task.samples("train")[: args.prompts]
    engine = RolloutEngine(model, tokenizer)  # fp32, EOS: every end-of-turn id declared
    params = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens)
    gen = torch.Generator().manual_seed(args.seed)
    scores, parsed, lengths, truncated = [], [], [], []
    t0 = time.perf_counter()
    for lo in range(0, len(samples), args.chunk):
        chunk = samples[lo : lo + args.chunk]
        batch = engine.generate(prompt_inputs(chunk), params, generator=gen)
        got = score_batch(task, batch.texts, [chunk[i] for i in batch.prompt_index.tolist()])
        scores += got.scores
        parsed += got.parsed
        lengths += batch.response_lengths.tolist()
        truncated += batch.truncated.tolist()
    per_prompt = torch.tensor(scores, dtype=torch.float64).view(len(samples), args.samples)
    means = per_prompt.mean(1)
    return {
        "task": "arithmetic_qa",
        "options": options,
        "system_prompt": system,
        "prompts": len(samples),
        "samples_per_prompt": args.samples,
        "n": len(scores),
        "pass_rate": float(per_prompt.mean()),
        "stderr": float(means.std(unbiased=True) / math.sqrt(len(samples))),
        "parsed_frac": sum(parsed) / len(parsed),
        "truncated_frac": sum(truncated) / len(truncated),
        "mean_response_tokens": sum(lengths) / len(lengths),
        "seconds": round(time.perf_counter() - t0, 1),
        "example_prompt": samples[0].prompt,
    }


def markdown(results: dict, meta: dict) -> str:
    lines = [
        "# arithmetic_qa pass rates of the real model at temperature 1",
        "",
        f"Written by `python bench/real_model_tasks.py` (model folder `{meta['model']}`, "
        f"fp32, fp8rl's rollout engine, temperature 1, top-p 1, at most "
        f"{meta['max_new_tokens']} new tokens, generator seed {meta['seed']}). Each variant: "
        f"the first {meta['prompts']} train problems x {meta['samples']} responses; the "
        "standard error is over the prompts' mean scores. Prompts go through the chat "
        'template (task.chat); the reward reads `\\boxed{}`, else an "answer is" phrase, '
        "else the last number (answer_fallback: last_number). Calculator system prompt: "
        f'"{CALCULATOR}"',
        "",
        "| variant | ops | digits | system prompt | N | pass rate | std. error | parsed "
        "| cut at max tokens | mean tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        system = "calculator" if r["system_prompt"] == CALCULATOR else r["system_prompt"]
        lines.append(
            f"| {name} | `{r['options']['ops']}` | {r['options']['digits']} | {system} "
            f"| {r['n']} | {r['pass_rate']:.3f} | {r['stderr']:.3f} | {r['parsed_frac']:.2f} "
            f"| {r['truncated_frac']:.2f} | {r['mean_response_tokens']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--chunk", type=int, default=16, help="prompts per generate call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default=str(ROOT / "docs" / "real-model" / "task-pass-rates"))
    ap.add_argument("--smoke", action="store_true", help="2 prompts x 2 samples x 8 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.samples, args.max_new_tokens = 2, 2, 8
    os.environ.setdefault("GOMP_SPINCOUNT", "0")  # idle OpenMP threads must not spin
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(args.model, dtype=torch.float32)
    model.eval()
    results = {}
    for name in args.variants:
        results[name] = measure(model, tokenizer, name, args)
        print(name, {k: v for k, v in results[name].items() if k != "example_prompt"})
    meta = {
        "model": Path(args.model).name,
        "prompts": args.prompts,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "threads": args.threads,
    }
    if args.smoke:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "variants": results}
    atomic_write_text(out.with_suffix(".json"), json.dumps(payload, indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(results, meta))


if __name__ == "__main__":
    main()
