"""Rollout engines side by side (`python bench/rollout.py --engines`): fp8rl's `RolloutEngine`,
vLLM (when importable) and `transformers`' generate, on the same model, prompts and lengths.

Two random Qwen3 models: the tiny one of the tests and one of about 50M parameters built from
a config. Every engine samples at temperature 1 with no top-k/top-p and no EOS (each response
runs to --new-tokens), in float32 on the CPU. tokens/s counts the tokens each engine actually
returned, best of --repeats after one warm-up call. vLLM runs two ways: `vllm.LLM.generate`
returning the sampled tokens' log-probs only, and fp8rl's `VllmRolloutEngine` (the
`rollout.engine: vllm` path), which asks for the same since issue 36 (before, it also asked for
the whole vocabulary's log-probs to compute the entropy, a Python object per vocabulary entry
and token). bench/vllm_rollout.py compares those two alone, interleaved, with medians.
"""

from __future__ import annotations

import time

import torch
import transformers

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.models import tiny_qwen3
from fp8rl.models.tiny import tiny_qwen3_config
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.rollout.vllm_options import vllm_available

MODELS = {
    "tiny": {},
    "qwen3-50m": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=32000,
        tie_word_embeddings=True,
    ),
}


def build_model(name: str):
    torch.manual_seed(0)
    if name == "tiny":
        return tiny_qwen3(seed=0).eval()
    return transformers.Qwen3ForCausalLM(tiny_qwen3_config(**MODELS[name])).eval()


def make_prompts(count: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, max_len // 2), max_len + 1, (count,), generator=g)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in lengths]


def best_rate(call, repeats: int) -> float:
    """tokens/s of the fastest of `repeats` calls after one warm-up; `call` returns tokens."""
    call()
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = call()
        best = max(best, tokens / (time.perf_counter() - t0))
    return best


def fp8rl_call(model, prompts, n: int, new_tokens: int):
    engine = RolloutEngine(model, pad_token_id=0, eos_token_id=[])
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(0)
    return lambda: engine.generate(prompts, params, generator=gen).num_tokens


def hf_call(model, prompts, n: int, new_tokens: int):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()  # prompts hold ids >= 1
    kw = dict(
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=n,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )

    def call() -> int:
        with torch.no_grad():
            out = model.generate(ids, **kw)
        return (out.shape[1] - width) * out.shape[0]

    return call


def vllm_engine(model):
    from fp8rl.rollout.vllm_engine import VllmRolloutEngine

    return VllmRolloutEngine(model, None, options={"max_model_len": 512}, eos_token_id=[])


def vllm_raw_call(engine, prompts, n: int, new_tokens: int):
    from vllm import SamplingParams as VllmParams

    params = VllmParams(
        n=n, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, seed=0
    )
    requests = [{"prompt_token_ids": p} for p in prompts]

    def call() -> int:
        outs = engine.llm.generate(requests, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return call


def vllm_fp8rl_call(engine, prompts, n: int, new_tokens: int):
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(0)
    return lambda: engine.generate(prompts, params, generator=gen).num_tokens


def bench_model(name: str, args) -> None:
    model = build_model(name)
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    engine = vllm_engine(model) if vllm_available() else None
    for rows in args.batch:
        if rows % args.n:
            raise SystemExit(f"--batch {rows} is not a multiple of --n {args.n}")
        prompts = make_prompts(rows // args.n, args.prompt_len, vocab, seed=rows)
        for steps in args.new_tokens:
            rates = time_engines(model, engine, prompts, args.n, steps, args.repeats)
            base = rates["transformers generate"]
            for k, r in rates.items():
                shown = "absent" if r is None else f"{r:,.0f}"
                ratio = "-" if r is None else f"{r / base:.2f}x"
                print(
                    f"| {name} ({n_params / 1e6:.1f}M) | {rows} | {steps} | {k} | "
                    f"{shown} | {ratio} |",
                    flush=True,
                )


def time_engines(model, engine, prompts, n: int, steps: int, repeats: int) -> dict:
    """tokens/s per engine; vLLM's rows say None (absent) where it is not importable."""
    calls = {
        "fp8rl RolloutEngine": fp8rl_call(model, prompts, n, steps),
        "transformers generate": hf_call(model, prompts, n, steps),
    }
    if engine is not None:
        calls["vllm.LLM.generate"] = vllm_raw_call(engine, prompts, n, steps)
        calls["fp8rl VllmRolloutEngine"] = vllm_fp8rl_call(engine, prompts, n, steps)
    rates = {k: best_rate(c, repeats) for k, c in calls.items()}
    if engine is None:
        rates["vllm"] = None
    return rates


def main(args) -> None:
    if vllm_available():
        import vllm

        version = f"vllm {vllm.__version__}"
    else:
        version = "vllm absent"
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {version}; "
        f"torch threads {torch.get_num_threads()}, n={args.n}, prompts up to "
        f"{args.prompt_len} tokens, best of {args.repeats}, float32"
    )
    print("| model | batch | new tokens | engine | tok/s | vs transformers |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        bench_model(name, args)
