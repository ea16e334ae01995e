"""Where a run came from: RUN/provenance.json, one entry per start or resume of the run with
the code commit (and whether the tree held uncommitted changes), the machine, the package
versions it ran with and the sha256 of every weight file it started from (a checkpoint
folder's safetensors, an init_weights or warm_start file), so a study's "one machine, commit
X, model Y" can be checked from its runs. An install without git (a wheel, a copied tree)
records "unknown", never a guess."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from ..utils import atomic_write_text, sha256_file

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


def start_weights(model) -> dict:
    """{path: sha256} of the weight files a run's model section starts from: the safetensors
    of a checkpoint folder (model.source), model.init_weights and a model.warm_start file.
    A random tiny model or an `auto` warm start (checked by its own sha256) has none."""
    files = []
    source = Path(model.source)
    if model.source != "tiny" and source.is_dir():
        files += sorted(source.glob("*.safetensors"))
    for path in (model.init_weights, model.warm_start):
        if path and path not in ("none", "auto") and Path(path).is_file():
            files.append(Path(path))
    return {str(f): sha256_file(f) for f in files}


def record(run_dir: Path, step: int, weights: dict | None = None) -> None:
    """Append this start (step 0) or resume (`step`) to RUN/provenance.json, with `weights`
    ({path: sha256}, start_weights) when given."""
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
    if weights is not None:
        entry["weights"] = weights
    atomic_write_text(path, json.dumps([*entries, entry], indent=1) + "\n")
