"""The GRPO run: a ~0.5B random Qwen3 (Qwen3-0.6B layer shapes) on the arithmetic task through
fp8rl's `Trainer`, full-pipeline FP8 with Calibrated Clipping: step times, the measured cost of
the shadow steps, peak memory, and the host syncs of one step (CUDA sync debug mode)."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from device_bench import Budget
from e2e.shapes import COMMON, fmt_params, n_params
from fp8rl.config import RunConfig, config_from_dict
from fp8rl.train.trainer import Trainer


def grpo_config(device, cfg, grpo_recipe: str, dtype_name: str, out_dir: str) -> RunConfig:
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
    return config_from_dict(data)


def step_within(trainer: Trainer, steps: int, budget: Budget) -> tuple[list[dict], str | None]:
    """Trainer.train_step until `steps` or until the budget cannot fit one more step."""
    rows, cut_short = [], None
    while trainer.step < steps:
        last = rows[-1]["time/wall_step"] if rows else 0.0
        if budget.out(reserve=last):
            cut_short = f"time budget spent after {len(rows)} of {steps} steps"
            print(f"  {cut_short}")
            break
        rows.append(trainer.train_step())
    return rows, cut_short


def run_grpo(device, cfg, grpo_recipe: str, dtype_name: str, out_dir: str, budget: Budget) -> dict:
    run_cfg = grpo_config(device, cfg, grpo_recipe, dtype_name, out_dir)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    trainer = Trainer(run_cfg, progress=False)
    rows, cut_short = step_within(trainer, cfg["grpo_steps"], budget)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    last = rows[-1]["time/wall_step"] if rows else 0.0
    syncs = None if budget.out(reserve=last) else count_host_syncs(trainer, device)
    res = {"recipe": grpo_recipe, "dtype": dtype_name, "steps": len(rows)}
    res.update(grpo_figures(rows, cfg, trainer, wall))
    res.update(peak_memory_gib=peak, host_syncs=syncs)
    res.update(grpo_outcome(rows, trainer, cut_short))
    res["checks"] = grpo_checks(rows, cfg, trainer, device, cut_short)
    res["passed"] = all(res["checks"].values())
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def grpo_figures(rows: list[dict], cfg, trainer: Trainer, wall: float) -> dict:
    """Step times; the shadow steps' extra cost over a plain step, amortized over the interval
    (steps 0-1 compile, so the medians start at step 2)."""
    interval = cfg["grpo_interval"]
    shadow_steps = [r for r in rows if r.get("train/shadow_step") == 1.0]
    plain = [r["time/wall_step"] for r in rows[2:] if r.get("train/shadow_step") == 0.0]
    later_shadow = [r["time/wall_step"] for r in shadow_steps if r["step"] > 0]  # step 0 compiles
    med = statistics.median(plain) if plain else None
    overhead = None
    if med and later_shadow:
        overhead = (statistics.mean(later_shadow) - med) / interval / med
    return {
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
    }


def grpo_outcome(rows: list[dict], trainer: Trainer, cut_short: str | None) -> dict:
    first, last = (rows[0], rows[-1]) if rows else ({}, {})
    return {
        "reward_first": first.get("rollout/reward") if rows else None,
        "reward_last": last.get("rollout/reward") if rows else None,
        "reward_mean": statistics.mean(r.get("rollout/reward", 0.0) for r in rows)
        if rows
        else None,
        "calib_lower_last": last.get("calib/lower") if rows else None,
        "calib_upper_last": last.get("calib/upper") if rows else None,
        "shadow_steps": [r["step"] for r in rows if r.get("train/shadow_step") == 1.0],
        "skipped_updates": trainer.skipped_updates,
        "cut_short": cut_short,
    }


def grpo_checks(rows: list[dict], cfg, trainer: Trainer, device, cut_short) -> dict:
    interval = cfg["grpo_interval"]
    losses = [r.get("actor/loss") for r in rows]
    shadow_steps = [r for r in rows if r.get("train/shadow_step") == 1.0]
    return {
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


def count_host_syncs(trainer, device) -> dict | None:
    """One more (non-shadow) step under torch.cuda.set_sync_debug_mode("warn"): how many
    device-to-host syncs a step makes, and where (CUDA only)."""
    if device.type != "cuda":
        return None
    import warnings

    from fp8rl.step.step import run_step

    ctx = trainer.context()
    step = trainer.step + int(ctx.calibration.is_shadow_step(trainer.step))
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
