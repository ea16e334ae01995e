"""The CPU study engine's cost: one FP8 step against one BF16 step of the ablation study's
setting (configs/study.yaml: chain_arithmetic, 8 prompts x 8 samples, 56 new tokens, 4
mini-batch updates, old log-probs in micro-batches of 16), split by phase.

Three arms are stepped in turn in one process, so machine load falls on all of them alike:
  bf16          the study's bf16 arm
  fp8-shadow    rowwise rollout, tensorwise training, calibrated, BF16 shadow passes every step
  fp8           the same without shadow passes (shadow_every larger than the run)
"shadow every 20" is (19 x fp8 + fp8-shadow) / 20 per step. Step 0 of each arm is a warm-up
and is not timed. With --profile a second pass splits each phase into quantization,
dequantization, FP8 GEMMs (emulated: the float32 matmul), high-precision linear forwards
and the rest, by self time (wrapping the fp8 functions; it adds a little overhead).

    python bench/cpu_study_step.py                     # 4 timed steps per arm, warm start
    python bench/cpu_study_step.py --profile --steps 2
    python bench/cpu_study_step.py --smoke             # seconds: 2 prompts, 8 tokens
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.fp8 import linear as fp8_linear
from fp8rl.fp8 import tensor as fp8_tensor
from fp8rl.step import records as step_records
from fp8rl.study.sweep.spec import load_spec, run_configs
from fp8rl.train.trainer import Trainer

SPEC = Path(__file__).resolve().parents[1] / "configs" / "study.yaml"
PHASES = ("rollout", "reward", "old_log_probs", "update", "calibrate")
PARTS = ("quantize", "dequantize", "fp8 GEMM", "hp linear fwd", "other")
ARMS = {
    "bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
    "fp8-shadow": {"loss": {"mode": "calibrated"}},
    "fp8": {
        "loss": {"mode": "calibrated"},
        "calibration": {"shadow_every": 1 << 20, "interval": 1 << 20},
    },
}


def arm_configs(out: Path, warm_start: str, smoke: bool) -> dict:
    base_over = {"model": {"warm_start": warm_start}, "log": {"progress": False, "eval_size": 0}}
    if smoke:
        base_over["rollout"] = {"prompts_per_step": 2, "n": 4, "max_new_tokens": 8}
        base_over["train"] = {"mini_batches": 2}
    spec = load_spec(SPEC)
    base = _merge(spec.base, base_over)
    spec = load_spec({"base": base, "arms": ARMS, "seeds": [0]})
    return {arm: cfg for (arm, _), cfg in run_configs(spec, out).items()}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class PhaseProfile:
    """Self time of the fp8 functions, by the step phase they run in."""

    def __init__(self):
        self.phase = "other"
        self.stack: list[list] = []  # [part, start, child seconds]
        self.seconds: dict[tuple[str, str], float] = {}

    def timed(self, part: str, fn):
        prof = self

        def wrapper(*args, **kwargs):
            prof.stack.append([part, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, t0, child = prof.stack.pop()
                dt = time.perf_counter() - t0
                key = (prof.phase, part)
                prof.seconds[key] = prof.seconds.get(key, 0.0) + dt - child
                if prof.stack:
                    prof.stack[-1][2] += dt

        return wrapper

    @contextlib.contextmanager
    def installed(self):
        patches = [
            (fp8_linear, "quantize", self.timed("quantize", fp8_linear.quantize)),
            (fp8_linear, "scaled_matmul", self.timed("fp8 GEMM", fp8_linear.scaled_matmul)),
            (
                fp8_tensor.Fp8Tensor,
                "dequantize",
                self.timed("dequantize", fp8_tensor.Fp8Tensor.dequantize),
            ),
            (F, "linear", self.timed("hp linear fwd", F.linear)),
        ]
        old_call = step_records.Timer.__call__
        prof = self

        def phase_call(timer, name):
            ctx = old_call(timer, name)

            def on_enter():
                prof.phase = name
                return ctx.__enter__()

            def on_exit(*exc):
                prof.phase = "other"
                return ctx.__exit__(*exc)

            return _Bound(on_enter, on_exit)

        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
        try:
            for obj, name, new in patches:
                setattr(obj, name, new)
            step_records.Timer.__call__ = phase_call
            yield self
        finally:
            for obj, name, old in saved:
                setattr(obj, name, old)
            step_records.Timer.__call__ = old_call


class _Bound:
    def __init__(self, enter, exit_):
        self._enter, self._exit = enter, exit_

    def __enter__(self):
        return self._enter()

    def __exit__(self, *exc):
        return self._exit(*exc)


def step_times(trainers: dict, steps: int) -> dict[str, list[dict]]:
    """Each arm's time/* of `steps` steps, the arms stepped in turn (after one warm-up)."""
    for t in trainers.values():
        t.run(1)
    rows = {arm: [] for arm in trainers}
    for _ in range(steps):
        for arm, t in trainers.items():
            row = t.run(1)[0]
            rows[arm].append({p: row.get(f"time/{p}", 0.0) for p in PHASES})
    return rows


def mean_phases(rows: list[dict]) -> dict[str, tuple[float, float]]:
    out = {}
    for p in (*PHASES, "step"):
        xs = [sum(r.values()) if p == "step" else r[p] for r in rows]
        se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
        out[p] = (statistics.fmean(xs), se)
    return out


def print_ratio_table(rows: dict[str, list[dict]]) -> None:
    m = {arm: mean_phases(r) for arm, r in rows.items()}
    every20 = {
        p: ((19 * m["fp8"][p][0] + m["fp8-shadow"][p][0]) / 20, 0.0) for p in (*PHASES, "step")
    }
    m["fp8 (shadow/20)"] = every20
    arms = list(m)
    print(f"\n{'phase':<15}" + "".join(f"{a + ' s':>18}" for a in arms) + "   ratios to bf16")
    for p in (*PHASES, "step"):
        cells = "".join(f"{m[a][p][0]:>11.3f}+-{m[a][p][1]:<5.3f}" for a in arms)
        b = m["bf16"][p][0]
        ratios = "  ".join(f"{a}: {m[a][p][0] / b:.2f}x" for a in arms[1:]) if b > 1e-6 else "-"
        print(f"{p:<15}{cells}   {ratios}")


def print_parts(prof: PhaseProfile, rows: dict[str, list[dict]], arm: str, steps: int) -> None:
    print(f"\n{arm}: seconds per step by phase and part (self time)")
    print(f"{'phase':<15}" + "".join(f"{p:>15}" for p in PARTS))
    mp = mean_phases(rows)
    for ph in PHASES:
        parts = {p: prof.seconds.get((ph, p), 0.0) / steps for p in PARTS[:-1]}
        parts["other"] = mp[ph][0] - sum(parts.values())
        print(f"{ph:<15}" + "".join(f"{parts[p]:>15.3f}" for p in PARTS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per arm (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study runs 1)")
    ap.add_argument("--warm-start", default="auto", help="auto (the study's) | none | PATH")
    ap.add_argument("--profile", action="store_true", help="also split phases by part")
    ap.add_argument("--smoke", action="store_true", help="a tiny setting, seconds")
    ap.add_argument(
        "--compiled", action="store_true", help="the torch.compile'd quantizer on the CPU too"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.compiled:
        from fp8rl.fp8 import fused

        fused.configure("inductor", cpu=True)
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = arm_configs(Path(tmp), args.warm_start, args.smoke)
        trainers = {arm: Trainer(cfg, progress=False) for arm, cfg in cfgs.items()}
        print(f"torch {torch.__version__}, {args.threads} thread(s), warm start {args.warm_start}")
        rows = step_times(trainers, args.steps)
        print_ratio_table(rows)
        if args.profile:
            for arm, t in trainers.items():
                with PhaseProfile().installed() as prof:
                    prof_rows = [
                        {p: r.get(f"time/{p}", 0.0) for p in PHASES} for r in t.run(args.steps)
                    ]
                print_parts(prof, prof_rows, arm, args.steps)


if __name__ == "__main__":
    main()
