"""Per-step metrics: one JSONL line per step, optional TensorBoard, a rich progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

METRICS_FILE = "metrics.jsonl"


def to_float(value) -> float | None:
    if torch.is_tensor(value):
        value = value.detach().float().cpu().item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    return None


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a crash: everything after it is gone too
    return rows


class MetricsLog:
    """Appends a JSON line per step; on resume, drops the steps after the checkpoint."""

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None, tensorboard: bool = False):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(run_dir) if r.get("step", -1) < resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard is an optional extra
                raise ImportError("log.tensorboard=true needs `pip install fp8rl[tensorboard]`") from e
            self.tb = SummaryWriter(str(self.path.parent / "tensorboard"))

    def write(self, step: int, metrics: dict) -> dict:
        row = {"step": step}
        for k, v in metrics.items():
            f = to_float(v)
            row[k] = f if f is not None or not isinstance(v, str) else v
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, float):
                    self.tb.add_scalar(k, v, step)
        return row

    def close(self):
        if self.tb is not None:
            self.tb.close()


class Progress:
    """A rich progress bar showing reward, entropy and the clip bounds; silent when disabled."""

    def __init__(self, total: int, start: int, description: str, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self.bar = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        )
        self.task = self.bar.add_task(description, total=total, completed=start, info="")
        self.bar.start()

    def update(self, row: dict):
        if not self.enabled:
            return
        parts = []
        for key, label in (("rollout/reward", "reward"), ("rollout/entropy", "entropy"),
                           ("calib/lower", "L"), ("calib/upper", "H")):
            if isinstance(row.get(key), float):
                parts.append(f"{label} {row[key]:.3f}")
        self.bar.update(self.task, advance=1, info="  ".join(parts))

    def close(self):
        if self.enabled:
            self.bar.stop()
