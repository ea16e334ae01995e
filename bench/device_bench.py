"""What the GPU bench scripts share: the device they may run on, their time budget, the goal
records the summary prints, and a results JSON rewritten after every part, so that a run
cut short keeps what it measured."""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from gpu_summary import fmt_target, fmt_value


def pick_device(smoke: bool, script: str) -> torch.device:
    """--smoke: the CPU, where the compiled quantizer is traced by dynamo's eager backend
    (the GPU's keys and guards, without code generation). Otherwise CUDA, or a one-line
    error: a GPU benchmark without a GPU measures nothing."""
    if smoke:
        from fp8rl.fp8 import fused

        fused.configure("eager", cpu=True)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit(
            f"{script}: error: no CUDA device (torch {torch.__version__}); "
            "--smoke runs the CPU check"
        )
    return torch.device("cuda")


class Budget:
    """The seconds a run may take (None: no limit); parts ask it before they start."""

    def __init__(self, seconds: float | None):
        self.seconds, self.t0 = seconds, time.perf_counter()

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (time.perf_counter() - self.t0)

    def out(self, reserve: float = 0.0) -> bool:
        return self.left() <= reserve

    def share(self, weight: float, of: float) -> Budget:
        """A part's budget: `weight / of` of what is left now (what it leaves passes on)."""
        return Budget(None if self.seconds is None else max(0.0, self.left()) * weight / of)


def goal(
    name: str,
    target: float,
    value,
    *,
    higher: bool = True,
    unit: str = "x",
    basis: str = "",
    judged: bool = True,
    **extra,
) -> dict:
    """One goal of docs/benchmarks.md: met is None when not judged (CPU) or not measured."""
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
        value = None
    met = (
        None if not judged or value is None else bool(value >= target if higher else value < target)
    )
    return {
        "goal": name,
        "target": target,
        "value": value,
        "higher": higher,
        "unit": unit,
        "met": met,
        "basis": basis,
        **extra,
    }


def print_goals(goals: list[dict]) -> None:
    print("\ngoals")
    for g in goals:
        verdict = {True: "met", False: "NOT met", None: "not judged"}[g["met"]]
        print(f"  {g['goal']}: {fmt_value(g)} (goal {fmt_target(g)}, {g['basis']}): {verdict}")


def peer_version(module: str) -> str:
    """A peer library's version, or "absent" (the GPU machine has no torchao)."""
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a peer that fails to import in any way is not measured
        return "absent"
    return str(getattr(mod, "__version__", "unknown version"))


def env_info(device: torch.device, smoke: bool, **extra) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "smoke": smoke,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        **extra,
    }
    for name in ("transformers", "triton"):
        version = peer_version(name)
        info[name] = None if version == "absent" else version
    if device.type == "cuda":
        info["card"] = torch.cuda.get_device_name(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
        info["cuda"] = torch.version.cuda
        info["memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    else:
        info["card"] = f"CPU ({platform.processor() or platform.machine()})"
    return info


def new_results(script: str, device: torch.device, smoke: bool, argv, **meta) -> dict:
    """`ran` is written first, `completed` last: a file with only the first was cut short."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "script": script,
        "ran": True,
        "completed": False,
        "smoke": smoke,
        "command": " ".join(["python", f"bench/{script}.py", *args]),
        "meta": env_info(device, smoke, **meta),
        "goals": [],
        "errors": {},
        "passed": None,
        "gpu_numbers_measured": not smoke,
    }


def check_summary(items: list[dict], timed) -> dict:
    """The part of a script's checks the summary table shows: how many passed, which failed,
    the worst gated error against the CPU emulation, and the recipes then timed."""
    errors = [
        i["error"]
        for i in items
        if isinstance(i.get("error"), (int, float)) and isinstance(i.get("gate"), float)
    ]
    return {
        "total": len(items),
        "passed": sum(bool(i["passed"]) for i in items),
        "failed": [i["name"] for i in items if not i["passed"]],
        "worst_error": max(errors, default=None),
        "timed": list(timed),
    }


def quantizer_report() -> dict:
    from fp8rl.fp8.fused import fused_report, fused_status

    keys = fused_report()
    counts = [k["compiles"] for k in keys if k["compiles"] is not None]
    return {
        "status": fused_status(),
        "keys": keys,
        "max_compiles_per_key": max(counts, default=None),
        "fallbacks": [k["key"] for k in keys if k["fallback"]],
    }


def write_results(result: dict, path: str | None) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(clean(result), indent=1, allow_nan=False))
    os.replace(tmp, p)  # a kill mid-write leaves the previous complete file


def clean(x):
    """JSON-safe: non-finite floats become null, tensors and other objects plain values."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, torch.Tensor):
        return clean(x.tolist())
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return str(x)
