"""End-to-end FP8 vs BF16 throughput, calibration cost included, and a GRPO run on the device.

One command, one run (under 8 minutes on one H200; random weights at real shapes, no downloads).
This file is the driver; each part below is a module of bench/e2e/ (checks, train, rollout,
grpo, goals, profiling; shapes holds the Qwen3 shapes and sizes):

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
import sys
import tempfile
import time

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from device_bench import (
    Budget,
    check_summary,
    new_results,
    pick_device,
    print_goals,
    quantizer_report,
    write_results,
)
from e2e import checks
from e2e.checks import run_all_checks
from e2e.goals import judge
from e2e.grpo import print_grpo, run_grpo
from e2e.profiling import run_profiles
from e2e.rollout import print_rollout, run_rollout
from e2e.shapes import INTERVAL, RECIPES, settings
from e2e.train import print_train, run_train, step_figures
from fp8rl.fp8 import high_precision, use_recipe

# the names the CPU tests reach through this module
__all__ = ["checks", "high_precision", "judge", "main", "print_grpo", "run_grpo", "settings"]
__all__ += ["step_figures", "use_recipe"]

PART_WEIGHTS = {"train": 4, "rollout": 3, "grpo": 3}  # shares of --budget-s after the checks


def parser() -> argparse.ArgumentParser:
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
    return ap


@dataclasses.dataclass
class Run:
    """What every part of one run reads: the arguments, the device, the sizes, the budget and
    the results being filled in (rewritten to --out after every part)."""

    args: argparse.Namespace
    device: torch.device
    cfg: dict
    budget: Budget
    result: dict
    parts: list[str]
    dtype: torch.dtype = torch.bfloat16
    t_start: float = dataclasses.field(default_factory=time.perf_counter)
    precisions: list[str] = dataclasses.field(default_factory=list)

    @property
    def smoke(self) -> bool:
        return self.args.smoke

    @property
    def check_finite(self) -> bool:
        return not self.args.no_finite_check

    def part(self, title: str, fn):
        return run_part(title, fn, self.result, self.args.out, self.device)

    def expect(self) -> dict:
        models = ["1b", "8b"] if "rollout" in self.parts else []
        return {"recipes": list(self.args.recipes), "models": models}

    def judge(self) -> list[dict]:
        res = self.result
        return judge(res["train"], res["rollout"], judged=not self.smoke, expect=self.expect())


def start(args, argv) -> Run:
    device = pick_device(args.smoke, "gpu_e2e")
    if args.smoke:
        torch.set_num_threads(args.threads)  # small CPU tensors time steadier on one thread
    cfg = settings(args.smoke)
    parts = [p for p in ("train", "rollout", "grpo") if p in (args.only or (p,))]
    check_finite = not args.no_finite_check
    result = new_results("gpu_e2e", device, args.smoke, argv, check_finite=check_finite)
    info = result["meta"]
    print(
        f"card: {info['card']}; torch {info['torch']}, transformers {info['transformers']}, "
        f"triton {info['triton']}; {info['date']}; FP8 finite checks "
        f"{'on (as the Trainer runs)' if check_finite else 'off'}"
    )
    result.update(settings={k: v for k, v in cfg.items() if k != "shapes"}, shapes=cfg["shapes"])
    result.update(budget_s=args.budget_s, checks=None, train=None, rollout=None, grpo=None)
    result.update(profile=None, timings_s={}, skipped={})
    return Run(args, device, cfg, Budget(args.budget_s), result, parts)


def run_checks_first(run: Run) -> list[str]:
    """The checks before any timing; the recipes that passed them (the only ones timed)."""
    args, res = run.args, run.result
    res["checks"] = run.part(
        "checks (before any timing)",
        lambda: run_all_checks(run.device, run.dtype, run.cfg, args.recipes, run.smoke),
    )
    timed = (res["checks"] or {}).get("recipes_passed", [])
    if res["checks"]:
        res["check_summary"] = check_summary(res["checks"]["layer"] + res["checks"]["model"], timed)
    if timed and len(timed) < len(args.recipes):
        failed = ", ".join(r for r in args.recipes if r not in timed)
        print(f"correctness checks FAILED for {failed}: timing {', '.join(timed)} only")
    return timed


def run_train_part(run: Run, budget: Budget):
    args = run.args
    value = run.part(
        "training step",
        lambda: run_train(
            run.device, run.dtype, run.cfg, run.precisions, run.check_finite, args.interval, budget
        ),
    )
    run.result["train"] = show(value, print_train)


def run_rollout_part(run: Run, budget: Budget):
    value = run.part(
        "rollout",
        lambda: run_rollout(
            run.device, run.dtype, run.cfg, run.precisions, run.check_finite, budget
        ),
    )
    run.result["rollout"] = show(value, print_rollout)


def run_grpo_part(run: Run, budget: Budget):
    args = run.args
    if args.grpo_recipe not in run.precisions:
        run.result["skipped"]["grpo"] = f"{args.grpo_recipe} failed its checks"
        print(f"\n=== GRPO run: skipped, {args.grpo_recipe} failed its checks ===")
        return

    def grpo():
        with tempfile.TemporaryDirectory(prefix="gpu_e2e_grpo_") as tmp:
            return run_grpo(run.device, run.cfg, args.grpo_recipe, args.grpo_dtype, tmp, budget)

    run.result["grpo"] = show(run.part("GRPO run", grpo), print_grpo)


PARTS = {"train": run_train_part, "rollout": run_rollout_part, "grpo": run_grpo_part}


def show(value, printer):
    if value is not None:
        printer(value)
    return value


def run_timed_parts(run: Run) -> None:
    """Train, rollout, GRPO in turn, each within its share of what is left of the budget."""
    parts = run.parts
    for i, part in enumerate(parts):
        if run.budget.out():
            run.result["skipped"][part] = "time budget spent"
            print(f"\n=== {part}: skipped, the time budget is spent ===")
            continue
        weights_left = sum(PART_WEIGHTS[p] for p in parts[i:])
        PARTS[part](run, run.budget.share(PART_WEIGHTS[part], weights_left))
        run.result["goals"] = run.judge()


def passed(result: dict) -> bool:
    """The checks passed, no part raised, and what ran produced finite numbers."""
    train, roll, grpo = result["train"], result["rollout"], result["grpo"]
    return bool(
        result["checks"]["passed"]
        and not result["errors"]
        and (train is None or all(d["losses_finite"] for d in train["depths"]))
        and (roll is None or all(r["finite"] for r in roll["rows"]))
        and (grpo is None or grpo["passed"])
    )


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.interval < 1:
        ap.error("--interval must be >= 1")
    run = start(args, argv)
    timed = run_checks_first(run)
    if not timed:
        print("correctness checks FAILED for every recipe: no timing on a broken FP8 path")
        return finish(run.result, args, run.t_start, run.smoke, passed=False)
    run.precisions = ["bf16"] + timed
    run_timed_parts(run)
    goals = run.result["goals"] = run.judge()
    print_goals(goals)
    if args.profile:
        what = (run.device, run.dtype, run.cfg, goals, run.check_finite, run.smoke)
        run.result["profile"] = run.part("profile", lambda: run_profiles(*what))
    if run.smoke:
        print(
            "\nCPU smoke run: FP8 GEMMs are emulated on the CPU, so these throughputs say nothing "
            "about FP8 speed. GPU numbers are still to be measured: run `python bench/gpu_e2e.py` "
            "on an H200."
        )
    elif not args.profile and any(g["met"] is False for g in goals):
        print(
            "\nsome goals were missed: rerun with --profile (and --only ...) to see where the "
            "time goes"
        )
    return finish(run.result, args, run.t_start, run.smoke, passed=passed(run.result))


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
