"""One run's peak resident memory against the estimate `fp8rl sweep` sizes its default --jobs
by (fp8rl.study.sweep.memory.peak_estimate).

Each point is one run of a config, two steps (Adam's moments exist from the first update on),
in a process of its own (its peak RSS from getrusage is then its own): a tiny model, and the
real model (SmolLM2-135M-Instruct, configs/real-model.yaml) at two batch sizes in float32 and
as configured (FP8 rowwise, Calibrated Clipping with a shadow step). The table shows measured
peak, estimate and their ratio; the estimate is meant to stay above every measured peak.

    python bench/sweep_memory.py --out docs/real-model/memory   # .md and .json
    python bench/sweep_memory.py --smoke                       # the tiny point only
    python bench/sweep_memory.py --from docs/real-model/memory.json --out docs/real-model/memory
                                          # the same peaks against today's estimate
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs" / "real-model.yaml"
TINY = ROOT / "configs" / "arithmetic.yaml"
FP32 = ["rollout.precision=fp32", "train.precision=fp32", "loss.mode=grpo"]
COMMON = ["log.progress=false", "log.eval_every=0", "log.checkpoint_every=0", "train.steps=2"]
FP32_POINTS = ("real fp32, 4 x 4 rows", "real fp32, 8 x 4 rows")
FP8_POINT = "real as configured (fp8-rowwise, calibrated), 8 x 4 rows"
POINTS = {  # name -> (config, overrides)
    "tiny (arithmetic.yaml, no warm start)": (TINY, ["model.warm_start=none"]),
    FP32_POINTS[0]: (REAL, [*FP32, "rollout.prompts_per_step=4"]),
    FP32_POINTS[1]: (REAL, FP32),
    FP8_POINT: (REAL, []),
}


def child(config: str, overrides: list[str]) -> None:
    """Run two steps (the second holds Adam's moments beside the activations); print
    {"peak": bytes} as the last line."""
    import torch

    from fp8rl.config import load_config
    from fp8rl.train.trainer import Trainer

    torch.set_num_threads(1)
    cfg = load_config(config, overrides)
    Trainer(cfg, progress=False).run(2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    print(json.dumps({"peak": peak}))


def point_args(name: str, model: str, out: Path) -> tuple[Path, list[str]]:
    config, overrides = POINTS[name]
    extra = [*COMMON, f"log.out_dir={out}", *overrides]
    if config == REAL:
        extra.append(f"model.source={model}")
    return config, extra


def measure(name: str, model: str, out: Path) -> dict:
    config, extra = point_args(name, model, out)
    print(f"[memory] {name}", file=sys.stderr, flush=True)
    cmd = [sys.executable, __file__, "--child", str(config), *extra]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return {"peak": json.loads(done.stdout.strip().splitlines()[-1])["peak"]}


def with_estimates(rows: dict[str, dict], model: str) -> dict[str, dict]:
    """The rows with today's estimate of each point (so --from re-renders measured peaks
    against retuned constants without rerunning them)."""
    from fp8rl.config import load_config
    from fp8rl.study.sweep.memory import peak_estimate

    out = {}
    for name, r in rows.items():
        config, extra = point_args(name, model, Path("unused"))
        cfg = load_config(config, extra)
        rows_ = cfg.rollout.prompts_per_step * cfg.rollout.n
        out[name] = {"peak": r["peak"], "estimate": peak_estimate(cfg), "rows": rows_}
    return out


def fit_line(rows: dict[str, dict]) -> str:
    """float32's peak per row and at no rows from its two points, and the FP8 point's
    activations (peak minus that intercept) against float32's at the same rows."""
    gib = 1 << 30
    (a, b), q = (rows[n] for n in FP32_POINTS), rows[FP8_POINT]
    slope = (b["peak"] - a["peak"]) / (b["rows"] - a["rows"])
    base = a["peak"] - slope * a["rows"]
    ratio = (q["peak"] - base) / (b["peak"] - base)
    est = (b["estimate"] - a["estimate"]) / (b["rows"] - a["rows"])
    return (
        f"float32: {slope / gib:.3f} GiB a row measured (the estimate: {est / gib:.3f}) between "
        "the two real float32 points, "
        f"{base / gib:.2f} GiB at no rows; the FP8 point's activations (its peak minus that) "
        f"are {ratio:.2f}x float32's at {b['rows']} rows."
    )


def report(rows: dict[str, dict]) -> str:
    gib = 1 << 30
    head = (
        f"Two steps per point, each in its own process, 1 torch thread; {platform.machine()}, "
        f"{os.cpu_count()} CPUs. Peak: the process's maximum resident set (getrusage)."
    )
    lines = ["| run | peak (GiB) | estimate (GiB) | estimate / peak |", "|---|---|---|---|"]
    for name, r in rows.items():
        peak, est = r["peak"] / gib, r["estimate"] / gib
        lines.append(f"| {name} | {peak:.2f} | {est:.2f} | {est / peak:.2f} |")
    parts = [head, "\n".join(lines)]
    if all(n in rows for n in (*FP32_POINTS, FP8_POINT)):
        parts.append(fit_line(rows))
    return "\n\n".join(parts)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    ap.add_argument("--smoke", action="store_true", help="the tiny point only")
    ap.add_argument("--from", dest="source", type=Path, help="re-render OUT.json's peaks")
    args = ap.parse_args()
    names = list(POINTS)[:1] if args.smoke else list(POINTS)
    if args.source:
        rows = json.loads(args.source.read_text(encoding="utf-8"))
    else:
        with tempfile.TemporaryDirectory(prefix="fp8rl-memory-") as tmp:
            rows = {n: measure(n, args.model, Path(tmp) / str(i)) for i, n in enumerate(names)}
    rows = with_estimates(rows, args.model)
    text = report(rows)
    print(text)
    if args.out:
        from fp8rl.utils import atomic_write_text

        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out.with_suffix(".md"), text + "\n")
        atomic_write_text(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
