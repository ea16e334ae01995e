"""Rollout throughput: high precision against FP8 (tensorwise, rowwise, blockwise).

Generated tokens per second of `RolloutEngine.generate` on the tiny Qwen3, every response
running to max_new_tokens (no EOS), plus the rollout/trainer mismatch each precision
causes: the k3 KL between the rollout's sampling log-probs and a high-precision trainer
forward on the same tokens. On the CPU the FP8 GEMMs are emulated (quantize, dequantize,
fp32 matmul), so FP8 is expected to be slower there; the ratio that matters is on a GPU.

    python bench/rollout.py            # batch 64 and 256, 32 and 64 new tokens
    python bench/rollout.py --smoke    # a few seconds
    python bench/rollout.py --engines --threads 1   # fp8rl, vLLM, transformers side by side
                                                    # (bench/rollout_engines.py)
"""

from __future__ import annotations

import argparse
import time

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
import rollout_engines
from fp8rl.fp8 import convert_to_fp8, high_precision
from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs

PRECISIONS = ("high", "tensorwise", "rowwise", "blockwise")


def make_prompts(count: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, max_len // 2), max_len + 1, (count,), generator=g)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in lengths]


def build(precision: str, device) -> RolloutEngine:
    model = tiny_qwen3(seed=0).to(device).eval()
    recipe = None
    if precision != "high":
        convert_to_fp8(model, precision)
        recipe = precision
    return RolloutEngine(model, recipe=recipe, pad_token_id=0, eos_token_id=[])


def timed(engine: RolloutEngine, prompts, params: SamplingParams, gen, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    batch = engine.generate(prompts, params, generator=gen)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, batch


def mismatch_k3(engine: RolloutEngine, batch, temperature: float) -> float:
    """k3 KL(rollout || high-precision trainer) over the batch's response tokens."""
    with torch.no_grad(), high_precision(engine.model):
        trainer, _ = compute_log_probs(engine.model, batch, temperature=temperature)
    d = (trainer - batch.log_probs)[batch.response_mask]
    return float((torch.expm1(d) - d).mean())


def run_case(engines: dict, prompts, params: SamplingParams, repeats: int, device) -> dict:
    """Best-of-`repeats` time per precision, the precisions interleaved within each repeat
    so that load from other processes hits them alike."""
    gens = {p: torch.Generator(device=device).manual_seed(0) for p in engines}
    for p, engine in engines.items():  # warm-up: first quantization, allocator
        engine.generate(prompts, params, generator=gens[p])
    best = {p: float("inf") for p in engines}
    last = {}
    for _ in range(repeats):
        for p, engine in engines.items():
            seconds, last[p] = timed(engine, prompts, params, gens[p], device)
            best[p] = min(best[p], seconds)
    return {
        p: {
            "tok_s": last[p].num_tokens / best[p],
            "k3": mismatch_k3(engines[p], last[p], params.score_temperature),
        }
        for p in engines
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256], help="rows (prompts x n)")
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=16, help="longest prompt (shortest is half)")
    ap.add_argument("--repeats", type=int, default=5, help="best of")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--smoke", action="store_true", help="batch 16, 8 new tokens, 1 repeat")
    ap.add_argument(
        "--engines",
        action="store_true",
        help="fp8rl's engine, vLLM and transformers generate side by side (high precision)",
    )
    ap.add_argument(
        "--models",
        nargs="+",
        default=list(rollout_engines.MODELS),
        choices=list(rollout_engines.MODELS),
        help="with --engines",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.new_tokens, args.repeats = [16], [8], 1
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engines:
        rollout_engines.main(args)
        return
    device = torch.device(args.device)
    print(
        f"device {device}, torch threads {torch.get_num_threads()}, n={args.n}, "
        f"prompts up to {args.prompt_len} tokens, best of {args.repeats}"
    )
    print("| batch | new tokens | precision | tok/s | vs high | k3 KL rollout/trainer |")
    print("| --- | --- | --- | --- | --- | --- |")
    engines = {p: build(p, device) for p in args.precisions}
    for batch in args.batch:
        if batch % args.n:
            raise SystemExit(f"--batch {batch} is not a multiple of --n {args.n}")
        prompts = make_prompts(batch // args.n, args.prompt_len, 64, seed=batch)
        for steps in args.new_tokens:
            params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=steps)
            results = run_case(engines, prompts, params, args.repeats, device)
            base = results.get("high", {}).get("tok_s")
            for p, r in results.items():
                ratio = f"{r['tok_s'] / base:.2f}x" if base else "-"
                print(
                    f"| {batch} | {steps} | {p} | {r['tok_s']:,.0f} | {ratio} | {r['k3']:.2e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
