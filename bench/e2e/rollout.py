"""The rollout: `RolloutEngine.generate` at batch 64 (8 prompts x n = 8), no EOS, of a ~1B
Qwen3 and the 36-layer 8B-shaped model, bf16 and the three recipes, with the k3 mismatch of the
sampled log-probs against a high-precision trainer."""

from __future__ import annotations

import torch

from device_bench import Budget
from e2e.shapes import build_qwen3, fmt_params, n_params, recipe
from fp8rl.fp8 import convert_to_fp8, high_precision
from fp8rl.rl.tis import k3_kl
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs
from gpu_fp8_linear import median_ms


def run_rollout(
    device, dtype, cfg, precisions, check_finite: bool, budget: Budget, models=("1b", "8b")
) -> dict:
    n, rows = 8, 64
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, max_new_tokens=cfg["roll_new_tokens"])
    out = {
        "batch": rows,
        "n": n,
        "prompt_len": cfg["roll_prompt_len"],
        "new_tokens": cfg["roll_new_tokens"],
        "rows": [],
    }
    for key in models:
        if budget.out():
            out["cut_short"] = f"time budget spent before model {key}"
            print(f"  {out['cut_short']}")
            break
        shape = cfg["shapes"][key]
        model = build_qwen3(shape, device, dtype).eval()
        convert_to_fp8(model, "blockwise")
        g = torch.Generator().manual_seed(4)
        prompts = torch.randint(
            1, shape["vocab_size"], (rows // n, cfg["roll_prompt_len"]), generator=g
        ).tolist()
        base = None
        for name in precisions:
            if budget.out():
                out["cut_short"] = f"time budget spent before model {key} {name}"
                print(f"  {out['cut_short']}")
                break
            engine = RolloutEngine(
                model, recipe=recipe(name, check_finite), pad_token_id=0, eos_token_id=[]
            )
            last = {}

            def gen(engine=engine, last=last, prompts=prompts):
                last["batch"] = engine.generate(
                    prompts, params, generator=torch.Generator(device).manual_seed(5)
                )

            ms = median_ms(gen, device, 1, cfg["roll_reps"])
            batch = last["batch"]
            with torch.no_grad(), high_precision(model):
                trainer_lp, _ = compute_log_probs(model, batch, temperature=batch.temperature)
            k3 = float(k3_kl(batch.log_probs, trainer_lp, batch.response_mask))
            tok_s = batch.num_tokens / ms * 1e3
            row = {
                "model": key,
                "params": n_params(model),
                "layers": shape["num_hidden_layers"],
                "precision": name,
                "ms": ms,
                "tok_s": tok_s,
                "k3_vs_high_precision": k3,
                "finite": bool(torch.isfinite(batch.log_probs).all()),
            }
            if name == "bf16":
                base = row
            if base is not None:
                row["speedup"] = tok_s / base["tok_s"]
            out["rows"].append(row)
        model = engine = last = batch = None  # free the device memory before the next model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def print_rollout(res: dict) -> None:
    print(
        f"\nrollout (RolloutEngine.generate, batch {res['batch']} = {res['batch'] // res['n']} "
        f"prompts x n {res['n']}, prompts of {res['prompt_len']} tokens, {res['new_tokens']} new "
        "tokens, no EOS; prefill included)"
    )
    print(
        "| model | parameters | precision | generated tok/s | x bf16 "
        "| k3 KL vs high-precision trainer |"
    )
    print("|" + " --- |" * 6)
    for r in res["rows"]:
        sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        print(
            f"| {r['model']} ({r['layers']} layers) | {fmt_params(r['params'])} | "
            f"{r['precision']} | {r['tok_s']:,.0f} | {sp} | {r['k3_vs_high_precision']:.2e} |"
        )
