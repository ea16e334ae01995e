"""Fp8Linear on a GPU: checks against the CPU emulation, then forward+backward speed against bf16.

1. Checks, each reporting its relative Frobenius-norm error against the CPU emulation and
   failing only on gross disagreement (over 1e-2: a wrong scale, layout or block mapping;
   correct Hopper accumulation and bf16 outputs stay far below it): the compiled quantizer
   against the eager one, `scaled_matmul` through torch._scaled_mm on identical FP8
   operands, and Fp8Linear's output and both gradients on the device against the same layer
   on the CPU, at M = 512 and at the odd token counts M = 37 and 130 (the Trainer's M is
   arbitrary). Plus "FP8 really ran": the output is 1e-3 to 8e-2 off a float64 linear.
2. Times forward+backward (median of CUDA-event timings) of bf16 nn.Linear, Fp8Linear with
   each recipe whose checks passed and, where torchao imports, its Float8Linear
   (torch.compile'd; "absent" otherwise), at M = 8192 tokens, (K, N) in {(4096, 4096),
   (4096, 12288), (12288, 4096)}.

The block-scaled recipes (mxfp8, mxfp4, nvfp4) take the same checks: on a GPU with
block-scaled tensor cores (SM100) they check torch's kernel against the CPU emulation; on
any other device (the H200 included) they run emulated, and their table columns and JSON
say "emulated". They have no speed goal yet.

    python bench/gpu_fp8_linear.py --out runs/bench/gpu_fp8_linear.json   # an H200: 1-2 min
    python bench/gpu_fp8_linear.py --smoke                                 # the CPU, small shapes

Goals (FP8 / BF16 forward+backward, worst shape): >= 1.4x tensorwise and rowwise, >= 1.25x
blockwise, and no slower than torchao's recipe of the same name. Each timed iteration drops
the layer's weight cache, as a training step (new weights) does. --budget-s stops the timing
between shapes. Exit status 1 when a check fails; without --smoke and CUDA, a one-line error.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time

import torch
import torch.nn as nn

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from device_bench import (
    Budget,
    check_summary,
    goal,
    new_results,
    peer_version,
    pick_device,
    print_goals,
    quantizer_report,
    write_results,
)
from fp8rl.fp8 import (
    Fp8Linear,
    Fp8Recipe,
    emulated_scaled_matmul,
    quantize,
    quantize_mx,
    scaled_matmul,
)
from fp8rl.fp8.mx_cuda import block_scaled_unsupported

BLOCK_SCALED = ("mxfp8", "mxfp4", "nvfp4")
RECIPES = ("tensorwise", "rowwise", "blockwise", *BLOCK_SCALED)
PEER_RECIPES = ("tensorwise", "rowwise")  # torchao's Float8Linear has no 1x128 / 128x128 recipe
GPU_SHAPES = ((4096, 4096), (4096, 12288), (12288, 4096))
SMOKE_SHAPES = ((256, 256), (256, 768), (768, 256))
GOALS = {"tensorwise": 1.4, "rowwise": 1.4, "blockwise": 1.25}
CHECK_GATE = 1e-2  # relative Frobenius-norm error against the CPU emulation
ODD_M = (37, 130)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_shapes(smoke: bool) -> list[tuple[int, int, int]]:
    """(M, K, N) of the checks: one even token count, then the odd ones."""
    k, n = (256, 384) if smoke else (1024, 768)
    return [(256 if smoke else 512, k, n)] + [(m, k, n) for m in ODD_M]


# --- checks -------------------------------------------------------------------------------


def run_checks(device: torch.device, shapes, recipes) -> list[dict]:
    """Every check's measured error; an exception in one becomes that check's failure."""
    checks: list[dict] = []

    def add(name, recipe, m, error, passed, detail, gate=CHECK_GATE):
        checks.append(
            {
                "name": name,
                "recipe": recipe,
                "m": m,
                "error": error,
                "gate": gate,
                "passed": bool(passed),
                "detail": detail,
            }
        )
        print(f"  [{'PASS' if passed else 'FAIL'}] {name} (M={m}): {detail}", flush=True)

    print(
        f"checks on {device}: bf16 inputs; "
        f"gate: relative error <= {CHECK_GATE:.0e} vs the CPU emulation"
    )
    for m, k, n in shapes:
        g = torch.Generator().manual_seed(m)
        x = (torch.randn(m, k, generator=g) * torch.logspace(-1, 1, m)[:, None]).to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g) * k**-0.5).to(torch.bfloat16)
        gy = torch.randn(m, n, generator=g).to(torch.bfloat16)
        for name in recipes:
            for what, fn in (
                ("quantize", _check_quantize),
                ("scaled_matmul", _check_gemm),
                ("Fp8Linear", _check_layer),
            ):
                try:
                    fn(add, device, Fp8Recipe.from_name(name), x, w, gy)
                except Exception as e:  # noqa: BLE001 - a broken kernel is a failed check, not a crash
                    add(
                        f"{name} {what}",
                        name,
                        m,
                        None,
                        False,
                        f"raised {type(e).__name__}: {e}"[:300],
                    )
                    if device.type == "cuda":
                        torch.cuda.synchronize()
    return checks


def emulated(name: str, device: torch.device) -> bool:
    """Does this block-scaled recipe run emulated on `device` (no block-scaled kernel)?"""
    if name not in BLOCK_SCALED:
        return False
    if device.type != "cuda":
        return True
    q = quantize_mx(torch.ones(1, 32, device=device), Fp8Recipe.from_name(name).block_format)
    return block_scaled_unsupported(q, q) is not None


def _mx(t: torch.Tensor, r: Fp8Recipe):
    return quantize_mx(t, r.block_format, scale_rounding=r.scale_rounding)


def _check_quantize(add, device, r, x, w, gy):
    if r.block_format:
        qd, qc = _mx(x.to(device), r), _mx(x, r)
        same = torch.equal(qd.scale.cpu().view(torch.uint8), qc.scale.view(torch.uint8))
        codes = (qd.data.cpu().view(torch.uint8) != qc.data.view(torch.uint8)).float().mean()
        e = rel(qd.dequantize(), qc.dequantize())
        detail = (
            f"rel err {e:.1e}; {codes.item():.1e} of element codes differ; scales equal: {same}"
        )
        add(f"{r.name} quantize {device} vs CPU", r.name, x.shape[0], e, e <= CHECK_GATE, detail)
        return
    qd = quantize(x.to(device), r.granularity, block=r.act_block)  # the compiled path
    qc = quantize(x, r.granularity, block=r.act_block, fused=False)
    codes = (qd.data.cpu().view(torch.uint8) != qc.data.view(torch.uint8)).float().mean().item()
    e = rel(qd.dequantize(), qc.dequantize())
    add(
        f"{r.name} quantize {device} vs CPU eager",
        r.name,
        x.shape[0],
        e,
        e <= CHECK_GATE,
        f"rel err {e:.1e}; {codes:.1e} of FP8 codes differ",
    )


def _check_gemm(add, device, r, x, w, gy):
    if r.block_format:
        a, b = _mx(x, r), _mx(w, r)
    else:
        a = quantize(x, r.granularity, block=r.act_block, fused=False)
        b = quantize(w, r.granularity, block=r.weight_block, fused=False)
    ref = emulated_scaled_matmul(a, b)
    out = scaled_matmul(a.to(device), b.to(device))
    e = rel(out, ref)
    add(
        f"{r.name} scaled_matmul {device} vs CPU emulation",
        r.name,
        x.shape[0],
        e,
        e <= CHECK_GATE,
        f"rel err {e:.1e}",
    )


def _check_layer(add, device, r, x, w, gy):
    m, k = x.shape
    n = w.shape[0]
    results = []
    for dev in (device, torch.device("cpu")):
        lin = nn.Linear(k, n, bias=True, dtype=torch.bfloat16, device=dev)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.zero_()
        layer = Fp8Linear.from_linear(lin, r)
        xi = x.to(dev).requires_grad_()
        y = layer(xi)
        y.backward(gy.to(dev))
        results.append((y.detach().cpu(), xi.grad.cpu(), layer.weight.grad.cpu()))
    errs = [rel(a_, b_) for a_, b_ in zip(*results, strict=True)]
    add(
        f"{r.name} Fp8Linear {device} vs CPU (y, dx, dW)",
        r.name,
        m,
        max(errs),
        max(errs) <= CHECK_GATE,
        "rel err " + ", ".join(f"{e:.1e}" for e in errs),
    )
    e = rel(results[0][0], nn.functional.linear(x.double(), w.double()))
    hi = 0.25 if r.fwd_fmt == "e2m1" else 0.08  # 4-bit elements: about 10 % per operand
    add(
        f"{r.name} Fp8Linear vs float64 linear",
        r.name,
        m,
        e,
        1e-3 < e < hi,
        f"rel err {e:.1e} (between 1e-3 and {hi:.0e}: the quantized GEMM really ran)",
        gate=[1e-3, hi],
    )


def recipes_that_passed(checks: list[dict], recipes) -> list[str]:
    return [r for r in recipes if all(c["passed"] for c in checks if c["recipe"] == r)]


# --- timing -------------------------------------------------------------------------------


def median_ms(fn, device: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fwd_bwd(layer: nn.Module, x: torch.Tensor, gy: torch.Tensor):
    def step():
        if isinstance(layer, Fp8Linear):
            layer.invalidate_weight_cache()  # a training step re-quantizes fresh weights
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x).backward(gy)

    return step


def torchao_layer(base: nn.Linear, name: str, device: torch.device):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    cfg = Float8LinearConfig.from_recipe_name(name)
    if device.type != "cuda":
        cfg = dataclasses.replace(cfg, emulate=True)
    model = nn.Sequential(copy.deepcopy(base))
    convert_to_float8_training(model, config=cfg)
    return torch.compile(model) if device.type == "cuda" else model


def columns(recipes, torchao: bool) -> list[str]:
    return [f"fp8 {r}" for r in recipes] + (
        [f"torchao {r}" for r in PEER_RECIPES] if torchao else []
    )


def time_shape(
    device, m, k, n, timed, skipped: dict, peer: str | None, warmup, reps, check_finite
) -> dict:
    """One (K, N): bf16, then every column; a column that cannot run says why instead.
    peer: torchao's version, "absent", or None (not timed)."""
    g = torch.Generator().manual_seed(1)
    base = nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        base.weight.copy_(torch.randn(n, k, generator=g) * k**-0.5)
    base = base.to(device)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device).requires_grad_()
    gy = torch.randn(m, n, dtype=torch.bfloat16, device=device)
    row = {
        "k": k,
        "n": n,
        "bf16_ms": median_ms(fwd_bwd(base, x, gy), device, warmup, reps),
        "ms": {},
        "why": {},
    }
    for col in columns(RECIPES, peer is not None):
        kind, r = col.split()
        if kind == "fp8" and r not in timed:
            if r in skipped:
                row["why"][col] = skipped[r]
            continue
        if kind == "torchao" and peer == "absent":
            row["why"][col] = "absent"
            continue
        try:
            if kind == "fp8":
                layer = Fp8Linear.from_linear(
                    copy.deepcopy(base), Fp8Recipe.from_name(r, check_finite=check_finite)
                )
            else:
                layer = torchao_layer(base, r, device)
            row["ms"][col] = median_ms(fwd_bwd(layer, x, gy), device, warmup, reps)
        except Exception as e:  # noqa: BLE001 - one failing column must not lose the others
            row["why"][col] = f"error: {type(e).__name__}: {e}"[:200]
            if device.type == "cuda":
                torch.cuda.synchronize()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def cell(row: dict, col: str) -> str:
    if col in row["ms"]:
        return f"{row['ms'][col]:.3f} ({row['bf16_ms'] / row['ms'][col]:.2f}x)"
    return row["why"].get(col, "-")


def print_table(m: int, device, rows: list[dict], cols: list[str]) -> None:
    print(
        f"\nforward+backward, M = {m} tokens, bf16 inputs, {device} (ms; speed-up = bf16 ms / ms)"
    )
    heads = [c + (" (emulated)" if emulated(c.split()[1], device) else "") for c in cols]
    print("| K x N | bf16 ms | " + " | ".join(heads) + " |")
    print("|" + " --- |" * (2 + len(cols)))
    for row in rows:
        print(
            f"| {row['k']} x {row['n']} | {row['bf16_ms']:.3f} | "
            + " | ".join(cell(row, c) for c in cols)
            + " |"
        )


def judge(rows: list[dict], recipes, torchao: str, m: int, judged: bool) -> list[dict]:
    goals = []
    basis = f"M = {m}, worst of {len(rows)} shape(s)"
    for r in recipes:
        if r not in GOALS:  # the block-scaled recipes: no speed goal yet
            continue
        ups = [row["bf16_ms"] / row["ms"][f"fp8 {r}"] for row in rows if f"fp8 {r}" in row["ms"]]
        goals.append(
            goal(
                f"Fp8Linear fwd+bwd {r} vs bf16",
                GOALS[r],
                min(ups, default=None),
                basis=basis,
                judged=judged,
                recipe=r,
            )
        )
    for r in PEER_RECIPES:
        if r not in recipes:
            continue
        vs = [
            row["ms"][f"torchao {r}"] / row["ms"][f"fp8 {r}"]
            for row in rows
            if f"torchao {r}" in row["ms"] and f"fp8 {r}" in row["ms"]
        ]
        goals.append(
            goal(
                f"Fp8Linear {r} vs torchao {r} (torchao ms / ours)",
                1.0,
                min(vs, default=None),
                basis=basis,
                judged=judged,
                recipe=r,
                peer=torchao,
            )
        )
    return goals


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="small shapes on the CPU (no GPU needed)")
    ap.add_argument("--out", default=None, help="write the results as JSON here (after every part)")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="stop timing new shapes after this long"
    )
    ap.add_argument("--m", type=int, default=None, help="tokens (default 8192; 256 with --smoke)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-torchao", action="store_true", help="skip torchao's Float8Linear")
    ap.add_argument(
        "--no-finite-check",
        action="store_true",
        help="time recipes with check_finite=False (no device sync per quantization)",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    smoke = args.smoke
    device = pick_device(smoke, "gpu_fp8_linear")
    budget = Budget(args.budget_s)
    m = args.m or (256 if smoke else 8192)
    shapes = SMOKE_SHAPES if smoke else GPU_SHAPES
    warmup = args.warmup if args.warmup is not None else (1 if smoke else 10)
    reps = args.reps or (5 if smoke else 30)
    if smoke:
        torch.set_num_threads(1)  # steadier timings of small CPU tensors on a shared machine
    res = new_results("gpu_fp8_linear", device, smoke, argv, check_finite=not args.no_finite_check)
    res["torchao"] = "not timed (--no-torchao)" if args.no_torchao else peer_version("torchao")
    peer = None if args.no_torchao else res["torchao"]
    meta = res["meta"]
    print(
        f"device: {meta['card']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"torchao {res['torchao']}"
    )

    t0 = time.perf_counter()
    res["emulated"] = {r: emulated(r, device) for r in args.recipes if r in BLOCK_SCALED}
    checks = run_checks(device, check_shapes(smoke), args.recipes)
    timed = recipes_that_passed(checks, args.recipes)
    res.update(
        checks=checks,
        checks_passed=all(c["passed"] for c in checks),
        check_summary=check_summary(checks, timed),
        timing={"m": m, "rows": []},
    )
    res["quantizer"] = quantizer_report()
    write_results(res, args.out)

    skipped = {r: "check failed" for r in args.recipes if r not in timed}
    rows = res["timing"]["rows"]
    for k, n in shapes:
        if budget.out():
            res["timing"]["cut_short"] = f"--budget-s {args.budget_s:g} s reached before {k} x {n}"
            print(f"\nbudget reached: {k} x {n} and later shapes not timed")
            break
        finite = not args.no_finite_check
        rows.append(time_shape(device, m, k, n, timed, skipped, peer, warmup, reps, finite))
        write_results(res, args.out)
    print_table(m, device, rows, columns(args.recipes, peer is not None))
    res["goals"] = judge(rows, args.recipes, res["torchao"], m, judged=device.type == "cuda")
    print_goals(res["goals"])
    res["quantizer"] = quantizer_report()
    print(f"\nquantizer: {res['quantizer']['status']}")
    if smoke:
        print(
            "CPU smoke run: FP8 GEMMs are emulated here, so these ratios say nothing about "
            "FP8 speed. GPU numbers are still to be measured: run this script on an H200."
        )
    res["passed"] = res["checks_passed"]
    res["completed"] = True
    res["total_s"] = time.perf_counter() - t0
    write_results(res, args.out)
    print(
        f"checks {'passed' if res['passed'] else 'FAILED'} ({sum(c['passed'] for c in checks)} of "
        f"{len(checks)}); total {res['total_s']:.1f} s"
    )
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
