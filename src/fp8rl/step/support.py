"""What the step needs beside its phases: phase timers and the words for non-finite values."""

from __future__ import annotations

import time

import torch


def causes(names: list[str], most: int = 3) -> str:
    shown = ", ".join(dict.fromkeys(names[:most]))
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def grad_finite_flags(model) -> list[tuple[str, torch.Tensor]]:
    flags = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None:
            g = g.to_local() if hasattr(g, "to_local") else g  # an FSDP shard: this rank's part
            flags.append((name, torch.isfinite(g).all()))
    return flags


def locate(nonfinite: list[str], grad_flags) -> str:
    """Where the non-finite values began, as far as train.fp8_check_finite lets us know."""
    if grad_flags is None:
        return "cause not located (train.fp8_check_finite is off)"
    parts = []
    if nonfinite:
        parts.append(f"non-finite FP8 inputs: {causes(nonfinite)}")
    bad = [name for name, ok in grad_flags if not bool(ok)]
    if bad:
        parts.append(f"non-finite gradients of {causes(bad)}")
    return "; ".join(parts) or "no non-finite FP8 input or gradient on this rank"


class Timer:
    """Seconds per phase (CUDA synchronised at both ends), as time/* metrics.

    Wall seconds (`time/<phase>`) and the process's CPU seconds over all its threads
    (`time/cpu_<phase>`): on a shared machine wall time measures the neighbours too.
    """

    def __init__(self):
        self.times: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()
                self.c0 = time.process_time()

            def __exit__(self, *exc):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timer.times[name] = timer.times.get(name, 0.0) + time.perf_counter() - self.t0
                timer.cpu[name] = timer.cpu.get(name, 0.0) + time.process_time() - self.c0

        return _Ctx()

    def metrics(self) -> dict:
        out = {f"time/{k}": v for k, v in self.times.items()}
        out["time/step"] = sum(self.times.values())
        out.update({f"time/cpu_{k}": v for k, v in self.cpu.items()})
        out["time/cpu_step"] = sum(self.cpu.values())
        return out
