"""--profile: torch.profiler's top kernels of what missed its goal (in the smoke run one of
each kind, only to exercise the code), their time by kind, and how busy the device was."""

from __future__ import annotations

import time

import torch

from e2e.shapes import RECIPES, build_qwen3, recipe, sync
from e2e.train import TrainBench, train_batch
from fp8rl.fp8 import convert_to_fp8
from fp8rl.rollout import RolloutEngine, SamplingParams

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
