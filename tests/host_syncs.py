"""Counting, on the CPU, the calls that would make a GPU wait: a value read back to the host.

`count_host_syncs()` patches the tensor methods that read values back (item, tolist, bool,
float, int, index, nonzero, numpy, cpu, boolean-mask indexing) and counts the calls made
from fp8rl's own code, by source line. On the CPU nothing syncs, so this is how a test can
hold the step to a budget that matters on a GPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

import torch

SRC = str(Path(__file__).resolve().parent.parent / "src" / "fp8rl")
_METHODS = (
    "item",
    "tolist",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "nonzero",
    "numpy",
    "cpu",
    "__getitem__",
)


def _caller() -> str | None:
    """file:line of the nearest frame outside this module and torch, if it is fp8rl's.

    Not counted: torch.optim (AdamW keeps its step counts on the host unless capturable) and
    fp8rl.utils.host_list, which reads tensors that live on the host by design (it raises for
    a device tensor)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if "/torch/optim/" in name or f.f_code.co_name == "host_list":
            return None
        if name != __file__ and "/torch/" not in name:
            return f"{Path(name).name}:{f.f_lineno}" if name.startswith(SRC) else None
        f = f.f_back
    return None


def _reads_back(method: str, args) -> bool:
    if method == "__getitem__":  # only a boolean mask makes the output size data-dependent
        index = args[0] if args else None
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)
    return True


@contextlib.contextmanager
def count_host_syncs():
    sites: Counter = Counter()
    originals = {m: getattr(torch.Tensor, m) for m in _METHODS}
    state = {"inside": False}  # a patched method calling another is one read, not two

    def wrap(method, fn):
        def patched(self, *args, **kwargs):
            if not state["inside"] and _reads_back(method, args):
                site = _caller()
                if site is not None:
                    sites[site] += 1
            outer, state["inside"] = state["inside"], True
            try:
                return fn(self, *args, **kwargs)
            finally:
                state["inside"] = outer

        return patched

    for m, fn in originals.items():
        setattr(torch.Tensor, m, wrap(m, fn))
    real_nonzero = torch.nonzero

    def nonzero(x, *a, **k):
        site = None if state["inside"] else _caller()
        if site is not None:
            sites[site] += 1
        return real_nonzero(x, *a, **k)

    torch.nonzero = nonzero
    try:
        yield sites
    finally:
        for m, fn in originals.items():
            setattr(torch.Tensor, m, fn)
        torch.nonzero = real_nonzero
