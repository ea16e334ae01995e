"""The training step: old-log-prob forward, one policy update (fp8rl's own
`step.update.update_minibatch`), the shadow forward and Algorithm 1, at two depths, projected to 36
layers; an RL step is `mini_batches` x (forward + update), calibration amortized."""

from __future__ import annotations

import dataclasses

import torch

from device_bench import Budget
from e2e.shapes import NOMINAL, build_qwen3, fmt_params, n_params, recipe, sync
from fp8rl.config import config_from_dict
from fp8rl.fp8 import convert_to_fp8, high_precision, use_recipe
from fp8rl.rl.calibration import calibrate_bounds
from fp8rl.rl.shadow import ShadowRows, shadow_metrics
from fp8rl.rollout import RolloutBatch, compute_log_probs
from fp8rl.step.context import UpdateContext, build_plan
from fp8rl.step.parallel import SingleProcess
from fp8rl.step.records import MiniBatch, StepData
from fp8rl.step.update import update_minibatch
from fp8rl.train.build import calibration_state, make_optimizer
from gpu_fp8_linear import median_ms


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

    The update is fp8rl's own `step.update.update_minibatch` (calibrated loss, backward, grad clip,
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
        plan = build_plan(cfg)
        # what the trainer's update reads, at the bounds a fresh run's first step uses
        self.uctx = UpdateContext.from_plan(
            plan,
            calibration_state(cfg).clip_bounds,
            model=model,
            optimizer=make_optimizer(model, cfg),
            train_recipe=None,
            dp=SingleProcess(),
            device=batch["advantages"].device,
            log_event=print,
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
        uctx = dataclasses.replace(self.uctx, train_recipe=rec)
        out = update_minibatch(uctx, data, MiniBatch.whole(self.rollout.response_mask))
        self.losses.append(out.metrics["actor/loss"])


def calibration_cost_ms(rows: int, length: int, device, warmup: int, reps: int) -> float:
    """Algorithm 1 and the shadow diagnostics on one step's pooled batch (float32 log-probs)."""
    g = torch.Generator().manual_seed(3)
    old_shadow = -torch.rand(rows, length, generator=g) * 3
    old = old_shadow + 0.03 * torch.randn(rows, length, generator=g)
    lp_shadow = old_shadow + 0.1 * torch.randn(rows, length, generator=g)
    lp = lp_shadow + 0.03 * torch.randn(rows, length, generator=g)
    adv = torch.randn(rows, generator=g)
    mask = torch.ones(rows, length, dtype=torch.bool)
    old, old_shadow, lp, lp_shadow, adv, mask = (
        t.to(device) for t in (old, old_shadow, lp, lp_shadow, adv, mask)
    )

    def work():
        shadow_metrics(
            ShadowRows(lp, old, lp_shadow, old_shadow, adv, mask), bounds=NOMINAL, nominal=NOMINAL
        )
        calibrate_bounds(
            torch.exp(lp - old),
            torch.exp(lp_shadow - old_shadow),
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
    for d in depths:
        add_rows(result, precisions, d["layers"], d["precisions"], d["shadow_forward_ms"], False)
    result["projection"] = None
    if len(depths) >= 2:
        per, shadow, result["projection"] = project(depths, precisions, cfg["project_layers"])
        if result["projection"]["valid"]:
            add_rows(result, precisions, cfg["project_layers"], per, shadow, True)
    return result


def add_rows(result: dict, precisions, layers: int, per: dict, shadow, projected: bool) -> None:
    """The step figures of one depth (measured or projected), each against its bf16 row."""
    m, tokens = result["mini_batches"], result["tokens_per_mini_batch"]
    bf16 = None
    for name in [n for n in precisions if n in per]:  # a budget may have cut a depth short
        p = per[name]
        fig = step_figures(
            p["forward_ms"],
            p["update_ms"],
            None if name == "bf16" else shadow,
            result["calibrate_ms"],
            m,
            result["interval"],
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


def project(depths: list[dict], precisions, lp: int):
    """Costs are linear in depth: the first and last depth give a per-layer cost and the
    figures at `lp` layers; valid only when every cost grew with depth (else timing noise)."""
    a, b = depths[0], depths[-1]

    def line(x0, x1):
        slope = (x1 - x0) / (b["layers"] - a["layers"])
        return x0 + slope * (lp - a["layers"]), slope

    both = [n for n in precisions if n in a["precisions"] and n in b["precisions"]]
    per, ok = {}, bool(both)
    for name in both:
        per[name] = {}
        for k in ("forward_ms", "update_ms"):
            per[name][k], slope = line(a["precisions"][name][k], b["precisions"][name][k])
            ok &= slope > 0
    shadow = None
    if a["shadow_forward_ms"] is not None and b["shadow_forward_ms"] is not None:
        shadow, slope = line(a["shadow_forward_ms"], b["shadow_forward_ms"])
        ok &= slope > 0
    elif any(n != "bf16" for n in both):
        ok = False  # FP8 rows without the shadow cost would leave calibration out
    per_layer = {
        name: {
            k: (b["precisions"][name][k] - a["precisions"][name][k]) / (b["layers"] - a["layers"])
            for k in ("forward_ms", "update_ms")
        }
        for name in both
    }
    return per, shadow, {"layers": lp, "valid": ok, "per_layer_ms": per_layer}


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
