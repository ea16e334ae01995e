"""A warm start as a file a study commits: the weights with their info beside them
(`X.safetensors` and `X.json`, the cache's layout), and the sha256 check a run makes of them.
A leaf module: run validation (config_checks) imports it without the warm-start builder."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from ..utils import atomic_write_bytes, atomic_write_text, sha256_file


def info_path_of(weights: Path | str) -> Path:
    """The info file beside a warm start's weights (`X.safetensors` -> `X.json`): the cache's
    layout, and that of a committed warm start, whose recorded sha256 a run then checks."""
    return Path(weights).with_suffix(".json")


def verified_sha256(weights: Path | str) -> str:
    """The sha256 of a warm start file; when an info file beside it records one, the two must
    match (a committed study start that was changed or cut short is refused, not trained on)."""
    path = Path(weights)
    digest = sha256_file(path)
    info = info_path_of(path)
    if not info.is_file():
        return digest
    try:
        recorded = json.loads(info.read_text()).get("sha256")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(
            "model.warm_start", str(path), f"a file whose info {info} reads as JSON ({e})"
        ) from e
    if recorded is not None and recorded != digest:
        raise ConfigError(
            "model.warm_start",
            str(path),
            f"a file with the sha256 {info} records ({recorded[:16]}...; this one is "
            f"{digest[:16]}...): restore it, e.g. `git checkout -- {path}`",
        )
    return digest


def write_with_info(src: Path, info: dict, out: Path) -> dict:
    """Copy a warm start to `out` with its info (sha256 of the copy included) beside it, both
    by a temporary name and a rename: the pair a study commits."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, Path(src).read_bytes())
    info = {**info, "sha256": sha256_file(out)}
    atomic_write_text(info_path_of(out), json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info
