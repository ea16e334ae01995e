"""Where a run came from: RUN/provenance.json, one entry per start or resume of the run with
the code commit (and whether the tree held uncommitted changes), the machine and the package
versions it ran with, so a study's "one machine, commit X" can be checked from its runs. An
install without git (a wheel, a copied tree) records "unknown", never a guess."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from ..utils import atomic_write_text

FILE = "provenance.json"
PACKAGES = ("fp8rl", "torch", "transformers", "safetensors", "numpy", "vllm", "verl", "trl")
UNKNOWN = "unknown"


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_version() -> dict:
    """The commit of the git tree fp8rl's own source lives in, and whether it is dirty; a
    tree that is not fp8rl's (a venv inside another repository) counts as no git."""
    here = Path(__file__).resolve().parents[1]  # src/fp8rl
    top = _git("rev-parse", "--show-toplevel", cwd=here)
    if not top or not (Path(top) / "src" / "fp8rl").resolve() == here:
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    commit = _git("rev-parse", "HEAD", cwd=here)
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=here)
    return {
        "commit": commit or UNKNOWN,
        "dirty": UNKNOWN if status is None else bool(status),
    }


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not installed: nothing of it ran
    return out


def machine() -> dict:
    out = {
        "host": platform.node() or UNKNOWN,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def record(run_dir: Path, step: int) -> None:
    """Append this start (step 0) or resume (`step`) to RUN/provenance.json."""
    path = Path(run_dir) / FILE
    entries = []
    if step and path.is_file():
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = []  # damaged: this entry still says what this part ran with
        if not isinstance(entries, list):
            entries = []
    entry = {"from_step": step, "code": code_version(), "machine": machine()}
    entry["packages"] = _versions()
    atomic_write_text(path, json.dumps([*entries, entry], indent=1) + "\n")
