"""GPU rollout throughput: `transformers` eager generate against our CUDA-graph decoder,
in bf16 and FP8 (tensorwise, rowwise, blockwise), as a fraction of the memory-bandwidth floor.

Random Qwen3 models (no downloads): "0.9b" (hidden 2048, 16 layers) and "8b-layers"
(hidden 4096, intermediate 12288, 4 layers). Every response runs to --new-tokens (no EOS).
Before any timing, greedy tokens of the graph decoder are compared with the eager engine; a
precision whose first tokens disagree (gross: a broken decoder) is reported and not timed.

The floor: each decode step must read every weight once (FP8 layers 1 byte per element,
the rest 2) plus the KV cache of the tokens so far (at the mean length over the decode);
at --bandwidth bytes/s that bounds tokens/s at batch / (bytes per step / bandwidth).

    python bench/gpu_rollout.py --out runs/bench/gpu_rollout.json  # an H200: both models, 2 batches
    python bench/gpu_rollout.py --smoke                             # CPU, tiny model, static

FP8 KV cache rows (`--kv-cache`, default both): each precision also with `rollout.kv_cache:
fp8` (keys and values in e4m3, 1 byte an element in the floor), path "ours PRECISION kv-fp8";
not judged by the goals.

vLLM column: when vLLM is importable and the run is on CUDA, `vllm.LLM` built from the same
weights (bf16, and `quantization: fp8`, vLLM's online FP8) is timed on the same prompts
(tokens/s, sampled log-probs returned, EOS ignored); otherwise its rows say "absent" (or "not
run" in the CPU smoke). vLLM's rows are not judged by the goals.

Goals: bf16 at batch 64 >= 25 % of the floor; FP8 >= 1.3x bf16 (worst batch). --budget-s stops
between (model, batch, precision) units; the JSON is rewritten after each. Without --smoke
and CUDA, a one-line error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch
import transformers

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from device_bench import (
    Budget,
    check_summary,
    goal,
    new_results,
    pick_device,
    print_goals,
    quantizer_report,
    write_results,
)
from e2e.shapes import SHAPES
from fp8rl.fp8 import Fp8Linear, convert_to_fp8, high_precision
from fp8rl.models import tiny_qwen3
from fp8rl.models.tiny import tiny_qwen3_config
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs
from gpu_rollout_vllm import time_vllm, vllm_engines

PRECISIONS = ("bf16", "tensorwise", "rowwise", "blockwise")
MODELS = {  # all linear dims multiples of 128: every recipe converts every projection
    "0.9b": dict(
        hidden_size=2048,
        intermediate_size=4096,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "8b-layers": {**SHAPES["8b"], "num_hidden_layers": 4},  # gpu_e2e's 8B layers, 4 deep
}
COMMON = dict(max_position_embeddings=4096, rope_theta=1_000_000.0, initializer_range=0.02)
FLOOR_GOAL = 0.25  # bf16 tokens/s as a fraction of the memory-bandwidth floor, batch 64
FP8_GOAL = 1.3  # FP8 tokens/s over bf16


def build(name: str, device, dtype):
    if name == "tiny":
        model = tiny_qwen3(seed=0, initializer_range=0.1)
    else:
        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.Qwen3ForCausalLM(tiny_qwen3_config(**COMMON, **MODELS[name]))
    model = model.to(device=device, dtype=dtype).eval()
    convert_to_fp8(
        model, "blockwise"
    )  # the strictest alignment; engines pick their recipe per call
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_bytes(model, fp8: bool, batch: int, mean_len: float, kv_bytes=None) -> float:
    """Bytes a decode step must read: weights (embedding: `batch` rows only) + the KV cache
    (`kv_bytes` an element: the model dtype's by default, 1 for the FP8 KV cache)."""
    cfg = model.config
    weights = sum(
        m.weight.numel() * (1 if fp8 and isinstance(m, Fp8Linear) else m.weight.element_size())
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )
    kv_bytes = model.dtype.itemsize if kv_bytes is None else kv_bytes
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * kv_bytes
    return weights + kv_per_token * batch * mean_len


def make_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(count)
    lengths = torch.randint(length // 2, length + 1, (count,), generator=g)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in lengths]


def engine(model, precision: str, decode: str, kv_cache: str = "model") -> RolloutEngine:
    recipe = None if precision == "bf16" else precision
    return RolloutEngine(
        model, recipe=recipe, pad_token_id=0, eos_token_id=[], decode=decode, kv_cache=kv_cache
    )


def check_correctness(model, precision, decode, prompts, new_tokens, device) -> dict:
    """Greedy tokens of `decode` against the eager engine; sampled log-probs against a trainer
    forward. Fails only when the first tokens disagree: they come from the same prefill, so
    that is a broken decoder, while later tokens may legitimately drift apart in FP8."""
    greedy = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    fast, slow = engine(model, precision, decode), engine(model, precision, "eager")
    a, b = fast.generate(prompts, greedy), slow.generate(prompts, greedy)
    same = a.response_ids == b.response_ids
    rows_equal = same.all(1).float().mean().item()
    first_equal = same[:, 0].float().mean().item()
    first_diff = [int((~r).nonzero()[0]) for r in same if not r.all()]
    sampled = fast.generate(
        prompts,
        SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
        generator=torch.Generator(device=device).manual_seed(0),
    )
    with (
        torch.no_grad(),
        high_precision(model),
    ):  # the converted layers would otherwise run their recipe
        trainer, _ = compute_log_probs(model, sampled, temperature=1.0)
    d = (trainer - sampled.log_probs)[sampled.response_mask]
    fast.release_buffers()
    k3 = (torch.expm1(d) - d).mean().item()
    detail = (
        f"greedy rows equal to eager: {rows_equal:.0%}, first tokens {first_equal:.0%}"
        + (f" (earliest divergence at token {min(first_diff)})" if first_diff else "")
        + f"; sampled log-probs vs a high-precision trainer forward: "
        f"max |d| {d.abs().max().item():.3g}, k3 KL {k3:.2e}"
    )
    return {
        "precision": precision,
        "passed": first_equal >= 0.5,
        "greedy_rows_equal": rows_equal,
        "first_tokens_equal": first_equal,
        "max_abs_logprob_diff": d.abs().max().item(),
        "k3_kl": k3,
        "detail": detail,
    }


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
    mask = (
        torch.arange(width, device=device)[None]
        >= width - torch.tensor([len(p) for p in prompts], device=device)[:, None]
    ).long()
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad(), high_precision(model):
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        sync(device)
    return time.perf_counter() - t0


def vllm_rows(engines: dict, model, entry, batch, prompts, mean_len, args) -> None:
    base = None
    for name, llm in engines.items():
        if isinstance(llm, str):
            entry["rows"].append({"batch": batch, "path": name, "tok_s": None, "note": llm})
            print(f"| {batch} | {name} | {llm} | | | | |", flush=True)
            continue
        first, rate = time_vllm(llm, prompts, args.new_tokens, args.repeats)
        base = rate if name == "vllm bf16" else base
        floor = batch * args.bandwidth / step_bytes(model, name != "vllm bf16", batch, mean_len)
        add_row(entry, batch, name, rate, floor, base, first)


def add_row(entry: dict, batch: int, path: str, rate, floor, base, first) -> None:
    """One measured (batch, path) row: into the JSON entry and printed as a table line."""
    entry["rows"].append(
        {
            "batch": batch,
            "path": path,
            "tok_s": rate,
            "floor_tok_s": floor,
            "of_floor": rate / floor,
            "vs_bf16": rate / base if base else None,
            "first_call_s": first,
        }
    )
    ratio = f"{rate / base:.2f}x" if base else "-"
    print(
        f"| {batch} | {path} | {rate:,.0f} | {floor:,.0f} | {rate / floor:.1%} | {ratio} | "
        f"{first:.2f} |",
        flush=True,
    )


def judge(models: list[dict], judged: bool) -> list[dict]:
    goals = []
    for m in models:
        bf16 = {r["batch"]: r for r in m["rows"] if r["path"] == "ours bf16"}
        batch = 64 if 64 in bf16 else min(bf16, default=None)  # the smoke run has batch 8 only
        goals.append(
            goal(
                f"rollout {m['name']} bf16 at batch 64: fraction of the bandwidth floor",
                FLOOR_GOAL,
                bf16[batch]["of_floor"] if bf16 else None,
                unit="%",
                basis=f"batch {batch}" if bf16 else "not measured",
                judged=judged and batch == 64,
                model=m["name"],
            )
        )
        for precision in m["precisions"]:
            if precision == "bf16":
                continue
            ups = [
                r["vs_bf16"] for r in m["rows"] if r["path"] == f"ours {precision}" and r["vs_bf16"]
            ]
            batches = sorted({r["batch"] for r in m["rows"] if r["path"] == f"ours {precision}"})
            goals.append(
                goal(
                    f"rollout {m['name']} {precision} vs bf16",
                    FP8_GOAL,
                    min(ups, default=None),
                    basis=f"worst of batch {', '.join(map(str, batches))}"
                    if ups
                    else "not measured",
                    judged=judged,
                    model=m["name"],
                    recipe=precision,
                )
            )
    return goals


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64, help="longest prompt (shortest is half)")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first (best of)")
    ap.add_argument(
        "--kv-cache",
        nargs="+",
        default=["model", "fp8"],
        choices=["model", "fp8"],
        help="rollout.kv_cache values timed per precision (fp8: e4m3 keys and values)",
    )
    ap.add_argument(
        "--bandwidth", type=float, default=4.3e12, help="bytes/s (H200 measured copy rate)"
    )
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, batch 8, 16 new tokens")
    ap.add_argument("--out", default=None, help="write the results as JSON here (after every unit)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting new (model, batch, precision) units after this long",
    )
    return ap


def start(args, argv, device) -> tuple[dict, torch.dtype, str]:
    """The results being filled in, the dtype and the decoder; the smoke run shrinks all."""
    if args.smoke:
        dtype, decode, args.models = torch.float32, "static", ["tiny"]
        args.batch, args.new_tokens, args.prompt_len, args.repeats = [8], 16, 12, 1
        torch.set_num_threads(1)
    else:
        dtype, decode = torch.bfloat16, "graph"
    res = new_results("gpu_rollout", device, args.smoke, argv, decode=decode)
    res.update(
        models=[],
        settings={
            "batch": args.batch,
            "new_tokens": args.new_tokens,
            "prompt_len": args.prompt_len,
            "repeats": args.repeats,
            "bandwidth": args.bandwidth,
            "decode": decode,
        },
    )
    return res, dtype, decode


def print_header(args, res, device, decode) -> None:
    card = res["meta"]["card"] if device.type == "cuda" else "CPU (smoke)"
    print(
        f"# {card}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{datetime.date.today().isoformat()}, decode={decode}, {args.new_tokens} new tokens, "
        f"prompts {args.prompt_len // 2}-{args.prompt_len} tokens, "
        f"floor at {args.bandwidth / 1e12:.1f} TB/s"
    )
    if args.smoke:
        print(
            "# SMOKE RUN on the CPU: checks the script end to end; GPU numbers are still to be "
            "measured"
        )


def check_precisions(entry: dict, model, args, decode: str, device) -> None:
    """Each precision's decoder against the eager engine; only those that pass are timed."""
    probe = make_prompts(8, args.prompt_len, model.config.vocab_size)
    for precision in args.precisions:
        try:
            c = check_correctness(model, precision, decode, probe, 32, device)
        except Exception as e:  # noqa: BLE001 - a broken precision is reported, the others run
            c = {
                "precision": precision,
                "passed": False,
                "detail": f"raised {type(e).__name__}: {e}"[:300],
            }
        c["name"] = f"{entry['name']} {precision} {decode} decoder vs eager"
        entry["checks"][precision] = c
        print(
            f"check {precision}: [{'PASS' if c['passed'] else 'FAIL'}] {c['detail']}",
            flush=True,
        )
    entry["precisions"] = [p for p in args.precisions if entry["checks"][p]["passed"]]


def bench_model(name: str, args, res: dict, device, dtype, decode: str, budget: Budget) -> None:
    model = build(name, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    entry = {
        "name": name,
        "params": n_params,
        "dtype": str(dtype),
        "checks": {},
        "precisions": [],
        "rows": [],
    }
    res["models"].append(entry)
    print(f"\n## model {name}: {n_params / 1e9:.2f}B parameters, {dtype}")
    check_precisions(entry, model, args, decode, device)
    res["check_summary"] = check_summary(
        [c for m in res["models"] for c in m["checks"].values()],
        sorted({p for m in res["models"] for p in m["precisions"]}, key=PRECISIONS.index),
    )
    write_results(res, args.out)
    engines = vllm_engines(model, args, device)
    print("| batch | path | tok/s | floor tok/s | of floor | vs bf16 | first call s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in args.batch:
        time_batch(model, entry, res, batch, args, decode, device, budget)
        if not budget.out():
            prompts = make_prompts(batch, args.prompt_len, model.config.vocab_size)
            mean_len = sum(map(len, prompts)) / batch + args.new_tokens / 2
            vllm_rows(engines, model, entry, batch, prompts, mean_len, args)
            write_results(res, args.out)


def time_batch(model, entry, res, batch: int, args, decode, device, budget: Budget) -> None:
    """One batch size: the transformers baseline, then each precision that passed its check."""
    prompts = make_prompts(batch, args.prompt_len, model.config.vocab_size)
    mean_len = sum(map(len, prompts)) / batch + args.new_tokens / 2
    tokens = batch * args.new_tokens
    if not args.no_hf and not budget.out():
        s = time_hf(model, prompts, args.new_tokens, device)
        floor = batch * args.bandwidth / step_bytes(model, False, batch, mean_len)
        entry["rows"].append(
            {
                "batch": batch,
                "path": "transformers generate",
                "tok_s": tokens / s,
                "floor_tok_s": floor,
                "of_floor": tokens / s / floor,
                "vs_bf16": None,
                "first_call_s": None,
            }
        )
        print(
            f"| {batch} | transformers generate | {tokens / s:,.0f} | {floor:,.0f} | "
            f"{tokens / s / floor:.1%} | - | - |",
            flush=True,
        )
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    base = None
    for precision in entry["precisions"]:
        if budget.out():
            res["cut_short"] = f"time budget spent before {entry['name']} batch {batch} {precision}"
            print(f"| {batch} | ours {precision} | {res['cut_short']} | | | | |")
            break
        for kv in args.kv_cache:
            eng = engine(model, precision, decode, kv)
            first, best = time_generate(eng, prompts, params, device, args.repeats)
            eng.release_buffers()
            rate = tokens / best
            base = rate if (precision, kv) == ("bf16", "model") else base
            kv_bytes = 1 if kv == "fp8" else None
            floor = (
                batch
                * args.bandwidth
                / step_bytes(model, precision != "bf16", batch, mean_len, kv_bytes)
            )
            path = f"ours {precision}" + (" kv-fp8" if kv == "fp8" else "")
            add_row(entry, batch, path, rate, floor, base, first)
            write_results(res, args.out)


def finish(res: dict, args, device, t_start: float) -> int:
    res["goals"] = judge(res["models"], judged=device.type == "cuda")
    print_goals(res["goals"])
    res["quantizer"] = quantizer_report()
    print(f"quantizer: {res['quantizer']['status']}")
    if args.smoke:
        print("\nGPU numbers are still to be measured (no GPU in this run).")
    res["passed"] = all(c["passed"] for m in res["models"] for c in m["checks"].values())
    res["completed"] = True
    res["total_s"] = time.perf_counter() - t_start
    write_results(res, args.out)
    print(f"checks {'passed' if res['passed'] else 'FAILED'}; total {res['total_s']:.1f} s")
    return 0 if res["passed"] else 1


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    device = pick_device(args.smoke, "gpu_rollout")
    budget = Budget(args.budget_s)
    res, dtype, decode = start(args, argv, device)
    t_start = time.perf_counter()
    print_header(args, res, device, decode)
    for name in args.models:
        if budget.out():
            res["cut_short"] = f"time budget spent before model {name}"
            print(f"\n{res['cut_short']}")
            break
        bench_model(name, args, res, device, dtype, decode, budget)
        if device.type == "cuda":  # the model is gone with bench_model's frame
            torch.cuda.empty_cache()
    return finish(res, args, device, t_start)


if __name__ == "__main__":
    sys.exit(main())
