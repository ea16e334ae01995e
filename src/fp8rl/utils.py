"""Small helpers usable from any layer."""

from __future__ import annotations

import hashlib
import io
import os
import random
import sys
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
    """Replace the file at `path` by `text`, encoded as UTF-8 whatever the locale, all at once
    (see `atomic_write_bytes`). An OS error is a one-line StorageError naming `path`."""
    atomic_write_bytes(path, text.encode("utf-8", errors="surrogateescape"), note=note)


def atomic_write_bytes(path, data: bytes, *, note: str = "") -> None:
    """Replace the file at `path` by `data` all at once: a temporary file beside it, fsynced,
    renamed over it, the folder fsynced. A failure or a kill at any moment leaves the old
    file whole (a full disk, a size limit or an encoding error fails the temporary file, which
    is removed). An OS error is a one-line StorageError naming `path` (not the temporary
    name) and `note`. The one way fp8rl replaces a file (tests/test_faults_writes.py)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os_errors("write", path, note=note):
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
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


def append_text(path, text: str, *, operation: str = "append to") -> None:
    """Append `text` to `path` as UTF-8 whatever the locale, in one write (an append-only log:
    metrics.jsonl, events.log). The encoding happens before the file is opened, so a text
    that cannot be written leaves the file as it was. The one way fp8rl appends."""
    data = text.encode("utf-8", errors="surrogateescape")
    with os_errors(operation, Path(path)), open(path, "ab") as fh:
        fh.write(data)


def run_main(main, argv: list[str] | None = None) -> int:
    """Run a command's `main` so that its output never becomes a traceback: a character the
    terminal's encoding lacks (a C locale) is written escaped, and a reader that left
    (`| head -1`) ends the command quietly, as it does any Unix tool."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        try:
            return main(argv)
        finally:  # also after argparse's SystemExit: its --help may meet a closed pipe
            sys.stdout.flush()
    except BrokenPipeError:
        # the interpreter flushes stdout again at exit: point it at nothing first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe ended


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_figure(fig, path, *, dpi: int) -> None:
    """A matplotlib figure written like any file fp8rl writes: rendered in memory, then
    `atomic_write_bytes` (the format from the suffix of `path`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
