"""The `rollout.engine: vllm` rollout of a step against bare `vllm.LLM.generate`, side by side.

One `vllm.LLM` (built by fp8rl's `VllmRolloutEngine` from the ~50M random Qwen3 with a 32k
vocabulary of bench/rollout_engines.py) serves both callers, on the same prompts and the same
sampling settings: n samples per prompt at temperature 1, no top-k/top-p, `--new-tokens`
tokens, one seed per request, the sampled token's log-prob returned. The two calls alternate
within every repeat (interleaved, so load on a shared machine hits both alike) and the table
gives medians. Weight sync (the push before a step's rollout) is timed on its own, and so is
what moved to the trainer: the old-log-prob pass with and without the entropy.

    OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \\
      build/venv-vllm/bin/python bench/vllm_rollout.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.rollout import SamplingParams, compute_log_probs
from rollout_engines import build_model, make_prompts


def vllm_params(n: int, new_tokens: int, seed: int):
    from vllm import SamplingParams as VllmParams

    return VllmParams(
        n=n,
        temperature=1.0,
        top_p=1.0,
        max_tokens=new_tokens,
        ignore_eos=True,
        seed=seed,
        logprobs=0,
        detokenize=False,
    )


def timed(call) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = call()
    return time.perf_counter() - t0, tokens


def main(args) -> None:
    import vllm

    from fp8rl.rollout.vllm_engine import VllmRolloutEngine

    torch.set_num_threads(args.threads)
    model = build_model("qwen3-50m")
    vocab = model.config.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    engine = VllmRolloutEngine(model, None, options={"max_model_len": 512}, eos_token_id=[])
    prompts = make_prompts(args.prompts, args.prompt_len, vocab, seed=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens)
    gen = torch.Generator().manual_seed(0)
    last = {}

    def fp8rl_path() -> int:
        last["batch"] = engine.generate(prompts, params, generator=gen)
        return last["batch"].num_tokens

    def bare() -> int:
        seeds = torch.randint(0, 1 << 31, (len(requests),), generator=gen).tolist()
        outs = engine.llm.generate(
            requests, [vllm_params(args.n, args.new_tokens, s) for s in seeds], use_tqdm=False
        )
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def old_pass(with_entropy: bool):
        def call() -> int:
            with torch.no_grad():
                compute_log_probs(model, last["batch"], with_entropy=with_entropy)
            return last["batch"].num_tokens

        return call

    calls = {
        "vllm.LLM.generate (bare)": bare,
        "rollout.engine: vllm (VllmRolloutEngine.generate)": fp8rl_path,
        "weight sync (sync_weights)": lambda: (engine.sync_weights(), 0)[1],
        "trainer old-log-prob pass": old_pass(False),
        "trainer old-log-prob pass + entropy": old_pass(True),
    }
    for call in calls.values():  # warm-up: vLLM's first generate, the allocator
        call()
    seconds = {k: [] for k in calls}
    tokens = {k: 0 for k in calls}
    for _ in range(args.repeats):
        for k, call in calls.items():
            s, t = timed(call)
            seconds[k].append(s)
            tokens[k] = t
    print(
        f"vllm {vllm.__version__}, torch {torch.__version__}; Qwen3 {n_params / 1e6:.1f}M, "
        f"vocab {vocab}; {args.prompts} prompts x n={args.n}, {args.new_tokens} new tokens, "
        f"float32, torch threads {args.threads}; median of {args.repeats} interleaved repeats"
    )
    base = statistics.median(seconds["vllm.LLM.generate (bare)"])
    print("| call | median s (min-max) | tokens | tok/s | time vs bare vLLM |")
    print("| --- | --- | --- | --- | --- |")
    for k in calls:
        med, lo, hi = statistics.median(seconds[k]), min(seconds[k]), max(seconds[k])
        rate = f"{tokens[k] / med:,.0f}" if tokens[k] else "-"
        print(
            f"| {k} | {med:.3f} ({lo:.2f}-{hi:.2f}) | {tokens[k] or '-'} | {rate} | "
            f"{med / base:.2f}x |"
        )
    if args.profile:  # where the rollout's time goes beyond vLLM's own generate
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(fp8rl_path)
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":  # vLLM starts its workers with spawn
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="cProfile one rollout call after")
    main(p.parse_args())
