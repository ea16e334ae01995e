"""End-to-end FP8 vs BF16 throughput, calibration cost included, and a GRPO run on the device.

One script, one run (under 8 minutes on one H200; random weights at real shapes, no downloads):

1. Checks before any timing, each reporting its measured error: `Fp8Linear` and `scaled_matmul`
   on the device against the CPU emulation at M = 512, 37 and 130 (bench/gpu_fp8_linear.py's
   checks, failing above a 1e-2 relative error), then a whole Qwen3 in FP8 on the device
   against the same weights on the CPU (float32, FP8 GEMMs emulated). A recipe that fails a
   check is left out of the timing; the others are still timed.
2. Training: a Qwen3 with Qwen3-8B layer shapes (hidden 4096, intermediate 12288, 32/8 heads,
   vocabulary 151,936) at two depths (1 and 4 layers), bf16 and FP8 tensorwise / rowwise /
   blockwise. Timed: the old-log-prob forward (no grad, training recipe), one policy update
   (`compute_log_probs` + calibrated policy loss + backward + grad clip + AdamW) and the
   high-precision shadow forward. One RL training step is `mini_batches` x (forward + update);
   a calibration step adds the two shadow passes (the batch once, each mini-batch once: 2 x
   `mini_batches` shadow forwards) and Algorithm 1 (`calibrate_bounds` + `shadow_metrics`),
   amortized over `--interval` steps. Costs are linear in depth: the two depths give a
   per-layer cost, and the step is projected to the 36 layers of Qwen3-8B (the full
   vocabulary's lm_head stays high precision and would otherwise dominate a few-layer model).
3. Rollout: `RolloutEngine.generate` at batch 64 (8 prompts x n = 8), no EOS, of a ~1B Qwen3
   (hidden 2048, 16 layers) and the full 36-layer 8B-shaped model, bf16 and the three recipes.
4. GRPO: a ~0.5B random Qwen3 (Qwen3-0.6B layer shapes) on the arithmetic task through
   fp8rl's `Trainer`, full-pipeline FP8 with Calibrated Clipping: step times, the measured
   cost of the shadow steps, peak memory, and the host syncs of one step (CUDA sync debug mode).

Goals (printed pass/fail): FP8 RL training step with calibration >= 1.5x BF16 tensorwise,
>= 1.35x rowwise, >= 1.15x blockwise; calibration under 5 % of the step at interval 20;
FP8 rollout >= 1.2x BF16. `--profile` adds torch.profiler's top kernels for what missed.

    python bench/gpu_e2e.py --out runs/bench/gpu_e2e.json        # on an H200
    python bench/gpu_e2e.py --smoke --out /tmp/smoke.json         # CPU, tiny shapes, < 1 min

The smoke mode runs the same code paths with tiny shapes and a couple of steps each (the
compiled quantizer traced by dynamo's eager backend) and writes the same JSON keys; its
timings say nothing about FP8 speed (the CPU emulates FP8). --budget-s splits the time after
the checks between the parts (4 : 3 : 3), which stop between units of work when their share
is spent; the JSON is rewritten after every part. Exit status 1 when a correctness check
fails (goals missed do not change it); without --smoke and CUDA, a one-line error.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

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
from fp8rl.fp8 import Fp8Recipe, convert_to_fp8, fp8_linears, high_precision, use_recipe
from fp8rl.models.tiny import tiny_qwen3_config
from fp8rl.rl.calibration import calibrate_bounds
from fp8rl.rl.diagnostics import k3_kl, shadow_metrics
from fp8rl.rollout import RolloutBatch, RolloutEngine, SamplingParams, compute_log_probs
from fp8rl.train.config import config_from_dict
from fp8rl.train.context import StepContext, make_optimizer
from fp8rl.train.parallel import SingleProcess
from fp8rl.train.step import MiniBatch, StepData, update_context, update_minibatch
from fp8rl.train.trainer import calibration_state
from gpu_fp8_linear import check_shapes, median_ms, recipes_that_passed, rel, run_checks

RECIPES = ("tensorwise", "rowwise", "blockwise")
TRAIN_GOALS = {"tensorwise": 1.5, "rowwise": 1.35, "blockwise": 1.15}
CALIB_GOAL = 0.05  # calibration cost / step time, at the interval below
ROLLOUT_GOAL = 1.2
INTERVAL = 20
NOMINAL = (0.8, 1.2)  # 1 - eps_low, 1 + eps_high
PART_WEIGHTS = {"train": 4, "rollout": 3, "grpo": 3}  # shares of --budget-s after the checks

# Qwen3 shapes. Every linear dim is a multiple of 128, so all three recipes convert every
# projection (lm_head stays high precision, as everywhere in fp8rl).
_HEADS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
SHAPES = {
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        vocab_size=151936,
        tie_word_embeddings=False,
        num_hidden_layers=36,
        **_HEADS,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=True,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "0.5b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        tie_word_embeddings=True,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "check": dict(
        hidden_size=512,
        intermediate_size=1536,
        vocab_size=2048,
        tie_word_embeddings=False,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
    ),
}
SMOKE_SHAPES = {
    "8b": dict(
        hidden_size=256,
        intermediate_size=768,
        vocab_size=1024,
        tie_word_embeddings=False,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "1b": dict(
        hidden_size=128,
        intermediate_size=384,
        vocab_size=1024,
        tie_word_embeddings=True,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "0.5b": dict(
        hidden_size=128,
        intermediate_size=384,
        tie_word_embeddings=True,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "check": dict(
        hidden_size=256,
        intermediate_size=768,
        vocab_size=512,
        tie_word_embeddings=False,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
}
COMMON = dict(max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6)


# ----------------------------------------------------------------------------- set-up


def settings(smoke: bool) -> dict:
    """Every size the run uses; the smoke mode shrinks them, nothing else changes."""
    if smoke:
        return dict(
            shapes=SMOKE_SHAPES,
            depths=(1, 2),
            project_layers=36,
            mb_rows=2,
            prompt_len=8,
            response_len=24,
            mini_batches=2,
            warmup=1,
            reps=2,
            roll_prompt_len=8,
            roll_new_tokens=6,
            roll_reps=1,
            grpo_steps=4,
            grpo_interval=2,
            grpo_prompts=8,
            grpo_n=4,
            grpo_new_tokens=6,
            grpo_min_tokens=8,
            check_tokens=(2, 16),
        )
    return dict(
        shapes=SHAPES,
        depths=(1, 4),
        project_layers=36,
        mb_rows=8,
        prompt_len=128,
        response_len=896,
        mini_batches=4,
        warmup=3,
        reps=10,
        roll_prompt_len=128,
        roll_new_tokens=64,
        roll_reps=2,
        grpo_steps=40,
        grpo_interval=INTERVAL,
        grpo_prompts=32,
        grpo_n=8,
        grpo_new_tokens=8,
        grpo_min_tokens=32,
        check_tokens=(4, 128),
    )


def build_qwen3(shape: dict, device, dtype, *, layers: int | None = None, seed: int = 0):
    """A random Qwen3 (transformers' own class) built directly on `device` in `dtype`."""
    from transformers import Qwen3ForCausalLM

    over = {**COMMON, **shape}
    if layers is not None:
        over["num_hidden_layers"] = layers
    cfg = tiny_qwen3_config(**over)
    old = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def recipe(name: str, check_finite: bool) -> Fp8Recipe | None:
    return None if name == "bf16" else Fp8Recipe.from_name(name, check_finite=check_finite)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- checks


def _bf16_rowwise_output(layer, inputs, output):
    if layer.recipe is not None and layer.recipe.granularity == "rowwise":
        return output.to(torch.bfloat16).to(output.dtype)
    return None


def check_model(device, dtype, shape: dict, recipes, rows_len) -> list[dict]:
    """A whole Qwen3 in FP8 on `device` against the same weights on the CPU with the FP8 GEMMs
    emulated, both in float32 so that only the FP8 path differs; then the model in the run's
    dtype: FP8 logits finite and measurably off high precision (FP8 really ran).

    The tight per-GEMM comparison is run_checks'. Across layers two correct FP8 paths drift
    apart: a difference d in a layer's input flips about d / ulp of the next FP8 codes, each by
    one ulp, so d grows to about sqrt(d * ulp) per quantization. On the CPU, a 1e-7 relative
    perturbation of the embeddings moves this 2-layer model's FP8 logits by about 0.2x the FP8
    error itself. The device must therefore stay under half the FP8 error; a wrong scale,
    layout or block mapping lands at or above it."""
    rows, length = rows_len
    model = build_qwen3(shape, device, torch.float32, seed=1).eval()
    ref = build_qwen3(shape, "cpu", torch.float32, seed=1).eval()
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    convert_to_fp8(model, "blockwise")
    convert_to_fp8(ref, "blockwise")
    if (
        device.type == "cuda"
    ):  # the rowwise kernel returns bf16 (docs/fp8.md): round the emulation alike
        for layer in fp8_linears(ref):
            layer.register_forward_hook(_bf16_rowwise_output)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, shape["vocab_size"], (rows, length), generator=g)
    items = []

    def report(item, text):
        items.append(item)
        print(f"  [{'PASS' if item['passed'] else 'FAIL'}] {item['name']}: {text}", flush=True)

    def guarded(name, title, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a recipe that raises fails, the others still run
            report(
                {
                    "name": title,
                    "recipe": name,
                    "passed": False,
                    "error": f"{type(e).__name__}: {e}"[:300],
                },
                f"raised {type(e).__name__}: {e}"[:300],
            )
            if device.type == "cuda":
                torch.cuda.synchronize()

    def versus_emulation(name, title):
        with use_recipe(model, name):
            dev = model(ids.to(device)).logits.double().cpu()
        with use_recipe(ref, name):
            emu = ref(ids).logits.double()
        e_emu, e_noise = rel(dev, emu), rel(emu, ref_hp)
        ok = bool(torch.isfinite(dev).all()) and e_emu <= 0.5 * e_noise and 1e-3 < e_noise < 0.5
        report(
            {
                "name": title,
                "recipe": name,
                "passed": ok,
                "rel_err_vs_emulation": e_emu,
                "fp8_vs_high_precision_cpu": e_noise,
            },
            f"rel err {e_emu:.2e} (FP8 vs high precision {e_noise:.2e})",
        )

    def versus_high_precision(name, title):
        with use_recipe(model, name):
            dev = model(ids.to(device)).logits.double().cpu()
        e = rel(dev, hp)
        ok = bool(torch.isfinite(dev).all()) and 1e-3 < e < 0.5
        report(
            {"name": title, "recipe": name, "passed": ok, "rel_err": e},
            f"rel err {e:.2e} (finite, FP8 really ran)",
        )

    with torch.no_grad():
        with high_precision(ref):
            ref_hp = ref(ids).logits.double()
        for name in recipes:
            title = f"{name} Qwen3 logits {device} vs CPU emulation (float32)"
            guarded(name, title, lambda name=name, title=title: versus_emulation(name, title))
        model.to(dtype)
        with high_precision(model):
            hp = model(ids.to(device)).logits.double().cpu()
        for name in recipes:
            title = f"{name} Qwen3 logits in {str(dtype)[6:]}: FP8 vs high precision"
            guarded(name, title, lambda name=name, title=title: versus_high_precision(name, title))
    return items


def run_all_checks(device, dtype, cfg, recipes, smoke: bool) -> dict:
    layer = run_checks(device, check_shapes(smoke), recipes)
    print(f"whole model ({cfg['shapes']['check']['num_hidden_layers']} layers):")
    items = check_model(device, dtype, cfg["shapes"]["check"], recipes, cfg["check_tokens"])
    every = layer + items
    return {
        "passed": all(i["passed"] for i in every),
        "fp8_linear_vs_emulation": all(c["passed"] for c in layer),
        "recipes_passed": recipes_that_passed(every, recipes),
        "layer": layer,
        "model": items,
    }


# ----------------------------------------------------------------------------- training


def train_batch(
    vocab: int, rows: int, prompt_len: int, response_len: int, device, seed: int
) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "prompt_ids": torch.randint(0, vocab, (rows, prompt_len), generator=g),
        "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.bool),
        "response_ids": torch.randint(0, vocab, (rows, response_len), generator=g),
        "response_mask": torch.ones(rows, response_len, dtype=torch.bool),
        "advantages": torch.randn(rows, generator=g),
    }
    return {k: v.to(device) for k, v in batch.items()}


class TrainBench:
    """The trainer's per-mini-batch work on one model: forward, update, shadow forward.

    The update is fp8rl's own `step.update_minibatch` (calibrated loss, backward, grad clip,
    the skip decision and AdamW), on a context that holds what the update reads."""

    def __init__(self, model, batch: dict, grad_clip: float = 1.0):
        self.model, self.batch = model, batch
        self.rollout = RolloutBatch(
            prompt_ids=batch["prompt_ids"],
            prompt_mask=batch["prompt_mask"],
            response_ids=batch["response_ids"],
            response_mask=batch["response_mask"],
            log_probs=torch.zeros_like(batch["response_mask"], dtype=torch.float32),
            entropy=torch.zeros_like(batch["response_mask"], dtype=torch.float32),
            truncated=torch.zeros_like(batch["advantages"], dtype=torch.bool),
            response_lengths=batch["response_mask"].sum(1),
            prompt_index=torch.arange(
                batch["advantages"].shape[0], device=batch["advantages"].device
            ),
        )
        cfg = config_from_dict(
            {
                "loss": {"mode": "calibrated"},
                "train": {
                    "grad_clip": grad_clip,
                    "lr": 1e-7,
                    "mini_batches": 1,
                    "fp8_check_finite": False,
                },
            }
        )
        device = batch["advantages"].device
        # the update reads neither the engine, the task, the prompts nor the seeds
        self.ctx = StepContext(
            cfg=cfg,
            model=model,
            engine=None,
            task=None,
            optimizer=make_optimizer(model, cfg),
            train_recipe=None,
            dp=SingleProcess(),
            calibration=calibration_state(cfg),
            seeds=None,
            prompts=None,
            log_event=print,
            device=device,
        )
        self.old = None
        self.losses: list[float] = []

    def forward(self, rec):
        """Old log-probs (no grad) under `rec`: the trainer's prepare_update for these rows."""
        with torch.no_grad(), use_recipe(self.model, rec):
            return compute_log_probs(self.model, self.batch)[0]

    def shadow(self):
        """A shadow pass: the same forward with quantization off (high_precision)."""
        with torch.no_grad(), high_precision(self.model):
            return compute_log_probs(self.model, self.batch)[0]

    def update(self, rec):
        """One optimizer update, as the trainer makes it (one mini-batch, one micro-batch)."""
        data = StepData(self.rollout, self.batch["advantages"], self.old, None, None)
        ctx = update_context(dataclasses.replace(self.ctx, train_recipe=rec))
        out = update_minibatch(ctx, data, MiniBatch.whole(self.rollout.response_mask))
        self.losses.append(out.metrics["actor/loss"])


def calibration_cost_ms(rows: int, length: int, device, warmup: int, reps: int) -> float:
    """Algorithm 1 and the shadow diagnostics on one step's pooled batch (float32 log-probs)."""
    g = torch.Generator().manual_seed(3)
    old_ref = -torch.rand(rows, length, generator=g) * 3
    old = old_ref + 0.03 * torch.randn(rows, length, generator=g)
    lp_ref = old_ref + 0.1 * torch.randn(rows, length, generator=g)
    lp = lp_ref + 0.03 * torch.randn(rows, length, generator=g)
    adv = torch.randn(rows, generator=g)
    mask = torch.ones(rows, length, dtype=torch.bool)
    old, old_ref, lp, lp_ref, adv, mask = (
        t.to(device) for t in (old, old_ref, lp, lp_ref, adv, mask)
    )

    def work():
        shadow_metrics(lp, old, lp_ref, old_ref, adv, mask, bounds=NOMINAL, nominal=NOMINAL)
        calibrate_bounds(
            torch.exp(lp - old),
            torch.exp(lp_ref - old_ref),
            adv,
            mask,
            nominal=NOMINAL,
            previous=NOMINAL,
        )

    return median_ms(work, device, warmup, reps)


def bench_train_depth(
    device, dtype, cfg, layers: int, precisions, check_finite: bool, budget: Budget
) -> dict:
    shape = cfg["shapes"]["8b"]
    model = build_qwen3(shape, device, dtype, layers=layers)
    convert_to_fp8(model, "blockwise")  # every projection converts; bf16 runs them as F.linear
    model.train()
    batch = train_batch(
        shape["vocab_size"],
        cfg["mb_rows"],
        cfg["prompt_len"],
        cfg["response_len"],
        device,
        seed=layers,
    )
    tb = TrainBench(model, batch)
    w, r = cfg["warmup"], cfg["reps"]
    out = {"layers": layers, "params": n_params(model), "precisions": {}}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    shadow_ms = None
    for name in precisions:
        if budget.out():
            out["cut_short"] = f"time budget spent before {name}"
            break
        rec = recipe(name, check_finite)
        tb.old = tb.forward(rec)
        fwd = median_ms(lambda rec=rec: tb.forward(rec), device, w, r)
        upd = median_ms(lambda rec=rec: tb.update(rec), device, w, r)
        if name != "bf16" and shadow_ms is None:  # the shadow forward is the same for all recipes
            shadow_ms = median_ms(tb.shadow, device, w, r)
        out["precisions"][name] = {"forward_ms": fwd, "update_ms": upd}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    sync(device)
    losses = torch.tensor(tb.losses, dtype=torch.float64)
    out["shadow_forward_ms"] = shadow_ms
    out["losses_finite"] = bool(torch.isfinite(losses).all())
    out["peak_memory_gib"] = (
        torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    )
    tb = model = None  # free the device memory before the next depth
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def step_figures(
    fwd: float, upd: float, shadow: float | None, calib: float, m: int, interval: int, tokens: int
) -> dict:
    """One RL training step = m x (old-log-prob forward + update); calibration amortized."""
    step = m * (fwd + upd)
    calib_per_step = 0.0 if shadow is None else (2 * m * shadow + calib) / interval
    return {
        "update_tok_s": tokens / upd * 1e3,
        "step_ms": step,
        "step_tok_s": m * tokens / step * 1e3,
        "calib_ms_per_step": calib_per_step,
        "step_calibrated_ms": step + calib_per_step,
        "step_calibrated_tok_s": m * tokens / (step + calib_per_step) * 1e3,
        "calib_overhead": calib_per_step / step,
    }


def run_train(
    device, dtype, cfg, precisions, check_finite: bool, interval: int, budget: Budget
) -> dict:
    m = cfg["mini_batches"]
    tokens = cfg["mb_rows"] * (cfg["prompt_len"] + cfg["response_len"])
    calib = calibration_cost_ms(
        m * cfg["mb_rows"], cfg["response_len"], device, cfg["warmup"], cfg["reps"]
    )
    depths = []
    for d in cfg["depths"]:
        if budget.out():
            print(f"  time budget spent: depth {d} not measured")
            break
        depths.append(bench_train_depth(device, dtype, cfg, d, precisions, check_finite, budget))
    shape = cfg["shapes"]["8b"]
    label = (
        f"Qwen3, hidden {shape['hidden_size']}, intermediate {shape['intermediate_size']}, "
        f"vocab {shape['vocab_size']}"
    )
    result = {
        "model": label,
        "mini_batch_rows": cfg["mb_rows"],
        "sequence_len": cfg["prompt_len"] + cfg["response_len"],
        "tokens_per_mini_batch": tokens,
        "mini_batches": m,
        "tokens_per_step": m * tokens,
        "interval": interval,
        "calibrate_ms": calib,
        "depths": depths,
        "rows": [],
    }

    def add_rows(layers, per, shadow, projected):
        bf16 = None
        for name in [n for n in precisions if n in per]:  # a budget may have cut a depth short
            p = per[name]
            fig = step_figures(
                p["forward_ms"],
                p["update_ms"],
                None if name == "bf16" else shadow,
                calib,
                m,
                interval,
                tokens,
            )
            row = {"layers": layers, "projected": projected, "precision": name, **p, **fig}
            if name == "bf16":
                bf16 = row
            if bf16 is not None:
                row["speedup_update"] = bf16["update_ms"] / p["update_ms"]
                row["speedup_step"] = row["step_tok_s"] / bf16["step_tok_s"]
                row["speedup_calibrated"] = row["step_calibrated_tok_s"] / bf16["step_tok_s"]
            result["rows"].append(row)

    for d in depths:
        add_rows(d["layers"], d["precisions"], d["shadow_forward_ms"], False)
    result["projection"] = None
    if len(depths) >= 2:
        (a, b), lp = (depths[0], depths[-1]), cfg["project_layers"]

        def project(x0, x1):
            slope = (x1 - x0) / (b["layers"] - a["layers"])
            return x0 + slope * (lp - a["layers"]), slope

        both = [n for n in precisions if n in a["precisions"] and n in b["precisions"]]
        per, ok = {}, bool(both)
        for name in both:
            per[name] = {}
            for k in ("forward_ms", "update_ms"):
                per[name][k], slope = project(a["precisions"][name][k], b["precisions"][name][k])
                ok &= slope > 0
        shadow = None
        if a["shadow_forward_ms"] is not None and b["shadow_forward_ms"] is not None:
            shadow, slope = project(a["shadow_forward_ms"], b["shadow_forward_ms"])
            ok &= slope > 0
        elif any(n != "bf16" for n in both):
            ok = False  # FP8 rows without the shadow cost would leave calibration out
        result["projection"] = {
            "layers": lp,
            "valid": ok,
            "per_layer_ms": {
                name: {
                    k: (b["precisions"][name][k] - a["precisions"][name][k])
                    / (b["layers"] - a["layers"])
                    for k in ("forward_ms", "update_ms")
                }
                for name in both
            },
        }
        if ok:
            add_rows(lp, per, shadow, True)
    return result


def print_train(res: dict) -> None:
    print(
        f"\ntraining ({res['model']}; {res['mini_batches']} mini-batches of "
        f"{res['mini_batch_rows']} x {res['sequence_len']} tokens per RL step; calibration every "
        f"{res['interval']} steps, "
        f"Algorithm 1 {res['calibrate_ms']:.2f} ms per calibration)"
    )
    print(
        "| layers | precision | update ms | update tok/s | RL step ms | step tok/s "
        "| + calib ms/step | calibrated tok/s | x bf16 (calibrated) | calib overhead |"
    )
    print("|" + " --- |" * 10)
    for r in res["rows"]:
        lay = f"{r['layers']} (projected)" if r["projected"] else str(r["layers"])
        sp = f"{r['speedup_calibrated']:.2f}x" if "speedup_calibrated" in r else "-"
        ov = f"{100 * r['calib_overhead']:.2f} %" if r["precision"] != "bf16" else "-"
        print(
            f"| {lay} | {r['precision']} | {r['update_ms']:.2f} | {r['update_tok_s']:,.0f} | "
            f"{r['step_ms']:.2f} | {r['step_tok_s']:,.0f} | {r['calib_ms_per_step']:.2f} | "
            f"{r['step_calibrated_tok_s']:,.0f} | {sp} | {ov} |"
        )
    for d in res["depths"]:
        mem = (
            f", peak memory {d['peak_memory_gib']:.1f} GiB"
            if d["peak_memory_gib"] is not None
            else ""
        )
        print(
            f"  {d['layers']} layer(s): {fmt_params(d['params'])} parameters, losses finite: "
            f"{d['losses_finite']}{mem}"
        )
    if res["projection"] is not None and not res["projection"]["valid"]:
        print("  projection to 36 layers skipped: a cost did not grow with depth (timing noise)")


# ----------------------------------------------------------------------------- rollout


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


# ----------------------------------------------------------------------------- GRPO run


def run_grpo(device, cfg, grpo_recipe: str, dtype_name: str, out_dir: str, budget: Budget) -> dict:
    from fp8rl.train.config import config_from_dict
    from fp8rl.train.trainer import Trainer

    shape = {**COMMON, **cfg["shapes"]["0.5b"], "max_position_embeddings": 512}
    data = {
        "name": f"gpu-e2e-grpo-{grpo_recipe}",
        # one-digit operands: a random policy still answers a few right, so advantages are non-zero
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+-*", "steps": 1, "train_size": 240, "test_size": 40},
        },
        "model": {"source": "tiny", "tiny": shape, "dtype": dtype_name, "device": device.type},
        "rollout": {
            "precision": f"fp8-{grpo_recipe}",
            "prompts_per_step": cfg["grpo_prompts"],
            "n": cfg["grpo_n"],
            "max_new_tokens": cfg["grpo_new_tokens"],
        },
        "train": {
            "precision": f"fp8-{grpo_recipe}",
            "steps": cfg["grpo_steps"],
            "lr": 1e-5,
            "mini_batches": 4,
        },
        "loss": {"mode": "calibrated"},
        "calibration": {"interval": cfg["grpo_interval"], "min_tokens": cfg["grpo_min_tokens"]},
        "log": {"out_dir": out_dir, "checkpoint_every": 0, "eval_every": 0, "progress": False},
    }
    run_cfg = config_from_dict(data)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    trainer = Trainer(run_cfg, progress=False)
    rows, cut_short = [], None
    while trainer.step < cfg["grpo_steps"]:  # one step per fit() so that the budget can stop it
        last = rows[-1]["time/wall_step"] if rows else 0.0
        if budget.out(reserve=last):
            cut_short = f"time budget spent after {len(rows)} of {cfg['grpo_steps']} steps"
            print(f"  {cut_short}")
            break
        trainer.cfg.train.steps = trainer.step + 1
        rows += trainer.fit()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    last = rows[-1]["time/wall_step"] if rows else 0.0
    syncs = None if budget.out(reserve=last) else count_host_syncs(trainer, device)
    interval = cfg["grpo_interval"]
    shadow_steps = [r for r in rows if r.get("train/shadow_step") == 1.0]
    plain = [r["time/wall_step"] for r in rows[2:] if r.get("train/shadow_step") == 0.0]
    later_shadow = [r["time/wall_step"] for r in shadow_steps if r["step"] > 0]  # step 0 compiles
    med = statistics.median(plain) if plain else None
    overhead = None
    if med and later_shadow:
        overhead = (statistics.mean(later_shadow) - med) / interval / med
    losses = [r.get("actor/loss") for r in rows]
    res = {
        "recipe": grpo_recipe,
        "dtype": dtype_name,
        "steps": len(rows),
        "interval": interval,
        "params": n_params(trainer.model),
        "rows_per_step": cfg["grpo_prompts"] * cfg["grpo_n"],
        "wall_s": wall,
        "step_s_median": med,
        "step_s_first": rows[0]["time/wall_step"] if rows else None,
        "shadow_step_s": later_shadow,
        "calib_overhead_measured": overhead,
        "phase_s_median": {
            k: statistics.median([r[k] for r in rows[2:] if k in r] or [float("nan")])
            for k in ("time/rollout", "time/reward", "time/old_log_probs", "time/update")
        },
        "peak_memory_gib": peak,
        "host_syncs": syncs,
        "reward_first": rows[0].get("rollout/reward") if rows else None,
        "reward_last": rows[-1].get("rollout/reward") if rows else None,
        "reward_mean": statistics.mean(r.get("rollout/reward", 0.0) for r in rows)
        if rows
        else None,
        "calib_lower_last": rows[-1].get("calib/lower") if rows else None,
        "calib_upper_last": rows[-1].get("calib/upper") if rows else None,
        "shadow_steps": [r["step"] for r in shadow_steps],
        "skipped_updates": trainer.skipped_updates,
        "cut_short": cut_short,
    }
    checks = {
        "steps ran (all, or until the time budget)": bool(rows)
        and (len(rows) == cfg["grpo_steps"] or bool(cut_short)),
        "losses finite": all(v is not None and math.isfinite(v) for v in losses),
        "no skipped updates": trainer.skipped_updates == 0,
        "shadow passes at the interval": [r["step"] for r in shadow_steps]
        == list(range(0, len(rows), interval)),
        "shadow metrics logged": all("shadow/nmae_prob" in r for r in shadow_steps)
        and bool(shadow_steps),
        "model on the device": next(trainer.model.parameters()).device.type == device.type,
    }
    res["checks"] = checks
    res["passed"] = all(checks.values())
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def count_host_syncs(trainer, device) -> dict | None:
    """One more (non-shadow) step under torch.cuda.set_sync_debug_mode("warn"): how many
    device-to-host syncs a step makes, and where (CUDA only)."""
    if device.type != "cuda":
        return None
    import warnings

    from fp8rl.train.step import run_step

    ctx = trainer.context()
    step = trainer.step + int(ctx.is_shadow_step(trainer.step))
    sites: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_step(ctx, step)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            key = f"{Path(w.filename).name}:{w.lineno}"
            sites[key] = sites.get(key, 0) + 1
    return {
        "step": step,
        "total": sum(sites.values()),
        "top_sites": dict(sorted(sites.items(), key=lambda kv: -kv[1])[:12]),
    }


def print_grpo(res: dict) -> None:
    print(
        f"\nGRPO (Trainer, arithmetic, {fmt_params(res['params'])}-parameter random Qwen3, "
        f"{res['dtype']} master weights, rollout and training fp8-{res['recipe']}, loss "
        f"calibrated, interval {res['interval']}, {res['rows_per_step']} responses per step)"
    )
    med = res["step_s_median"]
    print(
        f"  {res['steps']} steps in {res['wall_s']:.1f} s; first step {res['step_s_first']:.2f} s, "
        f"median step {med:.3f} s"
        if med is not None
        else f"  {res['steps']} steps in {res['wall_s']:.1f} s"
    )
    print(
        "  median phase s: "
        + ", ".join(f"{k[5:]} {v:.3f}" for k, v in res["phase_s_median"].items())
    )
    if res["shadow_step_s"]:
        ov = res["calib_overhead_measured"]
        print(
            "  shadow steps after the first: "
            f"{', '.join(f'{s:.3f}' for s in res['shadow_step_s'])} s; "
            f"amortized calibration overhead {100 * ov:.2f} % of a step"
            if ov is not None
            else ""
        )
    if res["peak_memory_gib"] is not None:
        print(f"  peak memory (torch.cuda.max_memory_allocated) {res['peak_memory_gib']:.2f} GiB")
    if res["host_syncs"] is not None:
        hs = res["host_syncs"]
        print(
            f"  host syncs in one step (set_sync_debug_mode): {hs['total']}; most from "
            + ", ".join(f"{k} x{v}" for k, v in list(hs["top_sites"].items())[:6])
        )
    if res["steps"]:
        print(
            f"  reward first/last/mean {res['reward_first']:.3f} / {res['reward_last']:.3f} / "
            f"{res['reward_mean']:.3f}; bounds now ({res['calib_lower_last']:.3f}, "
            f"{res['calib_upper_last']:.3f})"
        )
    if res["cut_short"]:
        print(f"  {res['cut_short']}")
    for name, ok in res["checks"].items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")


# ----------------------------------------------------------------------------- goals, profile


def judge(
    train: dict | None, rollout: dict | None, judged: bool, expect: dict | None = None
) -> list[dict]:
    """The goals of what was measured; with `expect` ({"recipes": [...], "models": [...]}) also
    a "not measured" row (value None) for every goal a failed check, error or budget left out."""
    goals = []

    def add(name, target, value, basis, kind, recipe_name, model=None, higher=True):
        goals.append(
            goal(
                name,
                target,
                value,
                higher=higher,
                unit="x" if higher else "%",
                basis=basis,
                judged=judged,
                kind=kind,
                recipe=recipe_name,
                model=model,
            )
        )

    rows, basis = [], "not measured"
    if train is not None and train["depths"]:
        proj = [r for r in train["rows"] if r["projected"]]
        rows = proj or [
            r for r in train["rows"] if r["layers"] == max(d["layers"] for d in train["depths"])
        ]
        basis = (
            f"projected to {rows[0]['layers']} layers"
            if proj
            else f"measured at {rows[0]['layers']} layers"
        )
    measured = {r["precision"]: r for r in rows}
    recipes = [r for r in (expect or {}).get("recipes", []) if r not in measured]
    interval = train["interval"] if train is not None else INTERVAL
    for name in [r for r in measured if r in TRAIN_GOALS] + recipes:
        r = measured.get(name, {})
        add(
            f"train step {name} (calibration included) vs bf16",
            TRAIN_GOALS[name],
            r.get("speedup_calibrated"),
            basis if r else "not measured",
            "train",
            name,
        )
    for name in [r for r in measured if r in TRAIN_GOALS] + recipes:
        r = measured.get(name, {})
        add(
            f"calibration overhead {name} at interval {interval}",
            CALIB_GOAL,
            r.get("calib_overhead"),
            basis if r else "not measured",
            "calibration",
            name,
            higher=False,
        )
    seen = set()
    batch = rollout["batch"] if rollout is not None else 64
    for r in (rollout or {}).get("rows", []):
        if r["precision"] != "bf16":
            seen.add((r["model"], r["precision"]))
            add(
                f"rollout {r['model']} {r['precision']} vs bf16",
                ROLLOUT_GOAL,
                r.get("speedup"),
                f"batch {batch}",
                "rollout",
                r["precision"],
                model=r["model"],
            )
    for model in (expect or {}).get("models", []):
        for name in (expect or {}).get("recipes", []):
            if (model, name) not in seen:
                add(
                    f"rollout {model} {name} vs bf16",
                    ROLLOUT_GOAL,
                    None,
                    "not measured",
                    "rollout",
                    name,
                    model=model,
                )
    return goals


KERNEL_KINDS = (
    (
        "gemm",
        (
            "gemm",
            "cutlass",
            "nvjet",
            "xmma",
            "scaled_mm",
            "cublas",
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::matmul",
            "aten::_scaled_mm",
        ),
    ),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("compiled (triton)", ("triton",)),
    ("copy / memset", ("memcpy", "memset", "copy")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_fn(fn, device, steps: int = 2, rows: int = 15) -> dict:
    """torch.profiler over `steps` calls of fn: the top kernels by self device time (CPU: self
    CPU time), time shares by kind, and how busy the device was against the wall clock."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = prof.key_averages()
    top = sorted(events, key=lambda e: getattr(e, attr, 0), reverse=True)
    busy = sum(getattr(e, attr, 0) for e in events) / 1e3 / steps
    kinds: dict[str, float] = {}
    for e in events:
        kinds[kernel_kind(e.key)] = (
            kinds.get(kernel_kind(e.key), 0.0) + getattr(e, attr, 0) / 1e3 / steps
        )
    return {
        "table": events.table(sort_by=attr, row_limit=rows),
        "wall_ms": wall_ms,
        "busy_ms": busy,
        "ms_by_kind": kinds,
        "top": [
            {
                "name": e.key,
                "kind": kernel_kind(e.key),
                "calls": e.count // steps,
                "self_ms": getattr(e, attr, 0) / 1e3 / steps,
            }
            for e in top[:rows]
        ],
    }


def run_profiles(device, dtype, cfg, goals, check_finite: bool, smoke: bool) -> dict:
    """Profile what missed its goal (in the smoke run: one of each kind, to exercise the path)."""
    missed = [g for g in goals if g["met"] is False or (smoke and g["met"] is None)]
    want_train = [
        r for r in RECIPES if any(g["kind"] != "rollout" and g["recipe"] == r for g in missed)
    ]
    want_roll: dict[str, list[str]] = {}
    for g in missed:
        if g["kind"] == "rollout" and g["recipe"] not in want_roll.setdefault(g["model"], []):
            want_roll[g["model"]].append(g["recipe"])
    if smoke:  # one of each, only to exercise the code
        want_train = want_train[:1]
        want_roll = {k: v[:1] for k, v in list(want_roll.items())[:1]}
    out = {}
    if want_train:
        shape = cfg["shapes"]["8b"]
        model = build_qwen3(shape, device, dtype, layers=cfg["depths"][-1])
        convert_to_fp8(model, "blockwise")
        tb = TrainBench(
            model,
            train_batch(
                shape["vocab_size"],
                cfg["mb_rows"],
                cfg["prompt_len"],
                cfg["response_len"],
                device,
                seed=9,
            ),
        )
        for name in ["bf16"] + want_train:
            rec = recipe(name, check_finite)
            tb.old = tb.forward(rec)
            out[f"train update {name}"] = profile_fn(lambda rec=rec: tb.update(rec), device)
        out["train shadow forward"] = profile_fn(tb.shadow, device)
        tb = model = None
    for key, names in want_roll.items():
        shape = cfg["shapes"][key]
        model = build_qwen3(shape, device, dtype).eval()
        convert_to_fp8(model, "blockwise")
        prompts = torch.randint(1, shape["vocab_size"], (8, cfg["roll_prompt_len"])).tolist()
        params = SamplingParams(n=8, max_new_tokens=min(16, cfg["roll_new_tokens"]))
        for pname in ["bf16"] + names:
            engine = RolloutEngine(
                model, recipe=recipe(pname, check_finite), pad_token_id=0, eos_token_id=[]
            )
            out[f"rollout {key} {pname}"] = profile_fn(
                lambda engine=engine, prompts=prompts, params=params: engine.generate(
                    prompts, params
                ),
                device,
                steps=1,
            )
        model = engine = None
    for title, p in out.items():
        print(
            f"\nprofile: {title} (top by self {'device' if device.type == 'cuda' else 'CPU'} time)"
        )
        print(p["table"])
        kinds = ", ".join(
            f"{k} {v:.2f} ms" for k, v in sorted(p["ms_by_kind"].items(), key=lambda kv: -kv[1])
        )
        what = "device busy" if device.type == "cuda" else "CPU op self time"
        print(f"per call: wall {p['wall_ms']:.2f} ms, {what} {p['busy_ms']:.2f} ms ({kinds})")
    return out


# ----------------------------------------------------------------------------- main


def run_part(title: str, fn, result: dict, out: str | None, device):
    """Run one part; an exception is recorded (and the run goes on with the next part), and
    the JSON is rewritten after every part so that a run cut short keeps what it measured."""
    t0 = time.perf_counter()
    print(f"\n=== {title} ===", flush=True)
    value = None
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - one broken part must not lose the others
        import traceback

        traceback.print_exc()
        result["errors"][title] = f"{type(e).__name__}: {e}"
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["timings_s"][title] = time.perf_counter() - t0
    print(f"({title}: {result['timings_s'][title]:.1f} s)", flush=True)
    result["quantizer"] = quantizer_report()
    write_results(result, out)
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU, a couple of steps each"
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here (after every part)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for the whole run; after the checks, train : rollout : GRPO get 4 : 3 : 3",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        choices=("train", "rollout", "grpo"),
        default=None,
        help="run only these parts (the checks always run)",
    )
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    ap.add_argument("--interval", type=int, default=INTERVAL, help="calibration interval (steps)")
    ap.add_argument("--grpo-recipe", choices=RECIPES, default="rowwise")
    ap.add_argument(
        "--grpo-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="master weights of the GRPO run",
    )
    ap.add_argument(
        "--no-finite-check",
        action="store_true",
        help="time recipes with check_finite=False (no device sync per quantization; "
        "the Trainer's recipes keep the check)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="torch.profiler top kernels of what missed its goal"
    )
    ap.add_argument("--threads", type=int, default=1, help="CPU threads in the smoke mode")
    args = ap.parse_args(argv)
    if args.interval < 1:
        ap.error("--interval must be >= 1")

    smoke = args.smoke
    device = pick_device(smoke, "gpu_e2e")
    budget = Budget(args.budget_s)
    dtype = torch.bfloat16
    if smoke:
        torch.set_num_threads(args.threads)  # small CPU tensors time steadier on one thread
    cfg = settings(smoke)
    parts = [p for p in ("train", "rollout", "grpo") if p in (args.only or (p,))]
    check_finite = not args.no_finite_check
    t_start = time.perf_counter()
    result = new_results("gpu_e2e", device, smoke, argv, check_finite=check_finite)
    info = result["meta"]
    print(
        f"card: {info['card']}; torch {info['torch']}, transformers {info['transformers']}, "
        f"triton {info['triton']}; {info['date']}; FP8 finite checks "
        f"{'on (as the Trainer runs)' if check_finite else 'off'}"
    )
    result.update(
        {
            "settings": {k: v for k, v in cfg.items() if k != "shapes"},
            "shapes": cfg["shapes"],
            "budget_s": args.budget_s,
            "checks": None,
            "train": None,
            "rollout": None,
            "grpo": None,
            "profile": None,
            "timings_s": {},
            "skipped": {},
        }
    )

    def show(value, printer):
        if value is not None:
            printer(value)
        return value

    result["checks"] = run_part(
        "checks (before any timing)",
        lambda: run_all_checks(device, dtype, cfg, args.recipes, smoke),
        result,
        args.out,
        device,
    )
    timed = (result["checks"] or {}).get("recipes_passed", [])
    if result["checks"]:
        checked = result["checks"]["layer"] + result["checks"]["model"]
        result["check_summary"] = check_summary(checked, timed)
    if not timed:
        print("correctness checks FAILED for every recipe: no timing on a broken FP8 path")
        return finish(result, args, t_start, smoke, passed=False)
    if len(timed) < len(args.recipes):
        print(
            "correctness checks FAILED for "
            f"{', '.join(r for r in args.recipes if r not in timed)}: "
            f"timing {', '.join(timed)} only"
        )
    precisions = ["bf16"] + timed
    expect = {"recipes": list(args.recipes), "models": ["1b", "8b"] if "rollout" in parts else []}

    def share(part):
        return budget.share(
            PART_WEIGHTS[part], sum(PART_WEIGHTS[p] for p in parts[parts.index(part) :])
        )

    def grpo(part_budget):
        with tempfile.TemporaryDirectory(prefix="gpu_e2e_grpo_") as tmp:
            return run_grpo(device, cfg, args.grpo_recipe, args.grpo_dtype, tmp, part_budget)

    for part in parts:
        if budget.out():
            result["skipped"][part] = "time budget spent"
            print(f"\n=== {part}: skipped, the time budget is spent ===")
            continue
        part_budget = share(part)
        if part == "train":
            result["train"] = show(
                run_part(
                    "training step",
                    lambda b=part_budget: run_train(
                        device, dtype, cfg, precisions, check_finite, args.interval, b
                    ),
                    result,
                    args.out,
                    device,
                ),
                print_train,
            )
        elif part == "rollout":
            result["rollout"] = show(
                run_part(
                    "rollout",
                    lambda b=part_budget: run_rollout(
                        device, dtype, cfg, precisions, check_finite, b
                    ),
                    result,
                    args.out,
                    device,
                ),
                print_rollout,
            )
        elif args.grpo_recipe not in timed:
            result["skipped"]["grpo"] = f"{args.grpo_recipe} failed its checks"
            print(f"\n=== GRPO run: skipped, {args.grpo_recipe} failed its checks ===")
        else:
            result["grpo"] = show(
                run_part("GRPO run", lambda b=part_budget: grpo(b), result, args.out, device),
                print_grpo,
            )
        result["goals"] = judge(result["train"], result["rollout"], judged=not smoke, expect=expect)
    result["goals"] = judge(result["train"], result["rollout"], judged=not smoke, expect=expect)
    print_goals(result["goals"])
    if args.profile:
        result["profile"] = run_part(
            "profile",
            lambda: run_profiles(device, dtype, cfg, result["goals"], check_finite, smoke),
            result,
            args.out,
            device,
        )
    ok = (
        result["checks"]["passed"]
        and not result["errors"]
        and (result["train"] is None or all(d["losses_finite"] for d in result["train"]["depths"]))
        and (result["rollout"] is None or all(r["finite"] for r in result["rollout"]["rows"]))
        and (result["grpo"] is None or result["grpo"]["passed"])
    )
    if smoke:
        print(
            "\nCPU smoke run: FP8 GEMMs are emulated on the CPU, so these throughputs say nothing "
            "about FP8 speed. GPU numbers are still to be measured: run `python bench/gpu_e2e.py` "
            "on an H200."
        )
    elif not args.profile and any(g["met"] is False for g in result["goals"]):
        print(
            "\nsome goals were missed: rerun with --profile (and --only ...) to see where the "
            "time goes"
        )
    return finish(result, args, t_start, smoke, passed=ok)


def finish(result: dict, args, t_start: float, smoke: bool, passed: bool) -> int:
    result["passed"] = passed
    result["quantizer"] = quantizer_report()  # an eager fallback would explain slow FP8
    result["completed"] = True
    result["total_s"] = time.perf_counter() - t_start
    print(f"quantizer: {result['quantizer']['status']}")
    print(f"{'all checks passed' if passed else 'a check FAILED'}; total {result['total_s']:.1f} s")
    write_results(result, args.out)
    if args.out:
        print(f"wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
