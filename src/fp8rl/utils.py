"""Small helpers usable from any layer."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import torch

from .errors import os_errors


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x over positions where mask is true; 0 where the mask is empty."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def json_safe(value):
    """`value` with every non-finite float (and 0-d tensor) as None: strict JSON has no NaN."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def host_list(x: torch.Tensor) -> list:
    """The values of a tensor that lives on the host by design (a CPU generator's draw, a mask
    computed from host rewards): reading it never waits for a GPU, and this says so."""
    if x.device.type != "cpu":
        raise ValueError(
            f"host_list: a tensor on {x.device}; reading it back would wait for the device"
        )
    return x.tolist()


def atomic_write_text(path, text: str, *, note: str = "") -> None:
    """Replace the file at `path` by `text` all at once: a temporary file beside it, fsynced,
    renamed over it, the folder fsynced. A failure or a kill at any moment leaves the old
    file whole (a full disk or a size limit fails the temporary file, which is removed).
    An OS error is a one-line StorageError naming `path` (not the temporary name) and `note`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os_errors("write", path, note=note):
        try:
            with open(tmp, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        folder = os.open(path.parent, os.O_RDONLY)
        try:  # the rename itself survives a power loss only once the folder is on disk
            os.fsync(folder)
        finally:
            os.close(folder)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
