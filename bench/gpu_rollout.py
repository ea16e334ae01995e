"""GPU rollout throughput: `transformers` eager generate against our CUDA-graph decoder,
in bf16 and FP8 (tensorwise, rowwise, blockwise), as a fraction of the memory-bandwidth floor.

Random Qwen3 models (no downloads): "0.9b" (hidden 2048, 16 layers) and "8b-layers"
(hidden 4096, intermediate 12288, 4 layers). Every response runs to --new-tokens (no EOS).
Before any timing, greedy tokens of the graph decoder are compared with the eager engine.

The floor: each decode step must read every weight once (FP8 layers 1 byte per element,
the rest 2) plus the KV cache of the tokens so far (at the mean length over the decode);
at --bandwidth bytes/s that bounds tokens/s at batch / (bytes per step / bandwidth).

    python bench/gpu_rollout.py            # one H200: both models, batch 64 and 256
    python bench/gpu_rollout.py --smoke    # CPU, tiny model, static decoder, seconds
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import transformers

from fp8rl.fp8 import Fp8Linear, convert_to_fp8, high_precision
from fp8rl.models import tiny_qwen3
from fp8rl.models.tiny import tiny_qwen3_config
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs

PRECISIONS = ("bf16", "tensorwise", "rowwise", "blockwise")
MODELS = {  # all linear dims multiples of 128: every recipe converts every projection
    "0.9b": dict(hidden_size=2048, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "8b-layers": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=4, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
COMMON = dict(max_position_embeddings=4096, rope_theta=1_000_000.0, initializer_range=0.02)


def build(name: str, device, dtype):
    if name == "tiny":
        model = tiny_qwen3(seed=0, initializer_range=0.1)
    else:
        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.Qwen3ForCausalLM(tiny_qwen3_config(**COMMON, **MODELS[name]))
    model = model.to(device=device, dtype=dtype).eval()
    convert_to_fp8(model, "blockwise")  # the strictest alignment; engines pick their recipe per call
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_bytes(model, fp8: bool, batch: int, mean_len: float) -> float:
    """Bytes a decode step must read: weights (embedding: `batch` rows only) + the KV cache."""
    cfg = model.config
    weights = sum(m.weight.numel() * (1 if fp8 and isinstance(m, Fp8Linear) else m.weight.element_size())
                  for m in model.modules() if isinstance(m, torch.nn.Linear))
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize
    return weights + kv_per_token * batch * mean_len


def make_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(count)
    lengths = torch.randint(length // 2, length + 1, (count,), generator=g)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in lengths]


def engine(model, precision: str, decode: str) -> RolloutEngine:
    recipe = None if precision == "bf16" else precision
    return RolloutEngine(model, recipe=recipe, pad_token_id=0, eos_token_id=[], decode=decode)


def check_correctness(model, precision, decode, prompts, new_tokens, device) -> str:
    """Greedy tokens of `decode` against the eager engine; sampled log-probs against a trainer forward."""
    greedy = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    fast, slow = engine(model, precision, decode), engine(model, precision, "eager")
    a, b = fast.generate(prompts, greedy), slow.generate(prompts, greedy)
    same = a.response_ids == b.response_ids
    rows_equal = same.all(1).float().mean().item()
    first_diff = [int((~r).nonzero()[0]) for r in same if not r.all()]
    if same[:, 0].float().mean().item() < 0.5:  # the first token comes from the same prefill
        raise SystemExit(f"{precision}: {decode} decoding disagrees with the eager engine on the first token")
    sampled = fast.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
                            generator=torch.Generator(device=device).manual_seed(0))
    with torch.no_grad(), high_precision(model):  # the converted layers would otherwise run their recipe
        trainer, _ = compute_log_probs(model, sampled, temperature=1.0)
    d = (trainer - sampled.log_probs)[sampled.response_mask]
    fast.release_buffers()
    return (f"greedy rows equal to eager: {rows_equal:.0%}"
            + (f" (earliest divergence at token {min(first_diff)})" if first_diff else "")
            + f"; sampled log-probs vs a high-precision trainer forward: "
              f"max |d| {d.abs().max().item():.3g}, k3 KL {(torch.expm1(d) - d).mean().item():.2e}")


def time_generate(eng, prompts, params, device, repeats: int):
    gen = torch.Generator(device=device).manual_seed(0)
    sync(device)
    t0 = time.perf_counter()
    eng.generate(prompts, params, generator=gen)  # first call: quantize, compile, capture
    sync(device)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        eng.generate(prompts, params, generator=gen)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return first, best


def time_hf(model, prompts, new_tokens, device) -> float:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = (torch.arange(width, device=device)[None] >= width - torch.tensor([len(p) for p in prompts],
                                                                            device=device)[:, None]).long()
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad(), high_precision(model):
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        sync(device)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64, help="longest prompt (shortest is half)")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first (best of)")
    ap.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s (H200 measured copy rate)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, batch 8, 16 new tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        device, dtype, decode, args.models = torch.device("cpu"), torch.float32, "static", ["tiny"]
        args.batch, args.new_tokens, args.prompt_len, args.repeats = [8], 16, 12, 1
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --smoke on the CPU")
        device, dtype, decode = torch.device("cuda"), torch.bfloat16, "graph"
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke)"
    print(f"# {card}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{datetime.date.today().isoformat()}, decode={decode}, {args.new_tokens} new tokens, "
          f"prompts {args.prompt_len // 2}-{args.prompt_len} tokens, floor at {args.bandwidth / 1e12:.1f} TB/s")
    if args.smoke:
        print("# SMOKE RUN on the CPU: checks the script end to end; GPU numbers are still to be measured")
    for name in args.models:
        model = build(name, device, dtype)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"\n## model {name}: {n_params / 1e9:.2f}B parameters, {dtype}")
        probe = make_prompts(8, args.prompt_len, model.config.vocab_size)
        for precision in args.precisions:
            print(f"check {precision}: " + check_correctness(model, precision, decode, probe, 32, device), flush=True)
        print("| batch | path | tok/s | floor tok/s | of floor | vs bf16 | first call s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for batch in args.batch:
            prompts = make_prompts(batch, args.prompt_len, model.config.vocab_size)
            mean_len = sum(map(len, prompts)) / batch + args.new_tokens / 2
            tokens = batch * args.new_tokens
            if not args.no_hf:
                s = time_hf(model, prompts, args.new_tokens, device)
                floor = batch * args.bandwidth / step_bytes(model, False, batch, mean_len)
                print(f"| {batch} | transformers generate | {tokens / s:,.0f} | {floor:,.0f} | "
                      f"{tokens / s / floor:.1%} | - | - |", flush=True)
            params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
            base = None
            for precision in args.precisions:
                eng = engine(model, precision, decode)
                first, best = time_generate(eng, prompts, params, device, args.repeats)
                eng.release_buffers()
                rate = tokens / best
                base = rate if precision == "bf16" else base
                floor = batch * args.bandwidth / step_bytes(model, precision != "bf16", batch, mean_len)
                ratio = f"{rate / base:.2f}x" if base else "-"
                print(f"| {batch} | ours {precision} | {rate:,.0f} | {floor:,.0f} | {rate / floor:.1%} | "
                      f"{ratio} | {first:.2f} |", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.smoke:
        print("\nGPU numbers are still to be measured (no GPU in this run).")


if __name__ == "__main__":
    main()
