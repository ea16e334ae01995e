"""Quantization of a high-precision tensor to FP8 at one of three granularities."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .formats import check_block, check_granularity, fp8_dtype
from .fused import cpu_path_on, fused_quantize_2d
from .kernels import quantize_2d
from .tensor import Fp8Tensor

# Open record_nonfinite() lists, innermost last. A module global, not a contextvar: on CUDA
# the backward runs in autograd's own thread, which a contextvar would not reach.
_NONFINITE_LOGS: list[list[str]] = []


@contextmanager
def record_nonfinite():
    """Inside, quantize(check_finite=True) appends "name (shape)" of each inf/nan input to the
    yielded list instead of raising; the FP8 result then holds nan, so whatever consumes it
    (a training step's loss or gradients) is non-finite too and can be skipped as a whole.
    """
    log: list[str] = []
    _NONFINITE_LOGS.append(log)
    try:
        yield log
    finally:  # by identity: list.remove would match any equal (say, empty) list
        del _NONFINITE_LOGS[next(i for i, x in enumerate(_NONFINITE_LOGS) if x is log)]


def check_input(x, fn: str, what: str) -> None:
    """One-line errors for what no quantizer takes: a non-tensor, an integer or 8-bit tensor,
    a 0-d or empty one."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype.itemsize < 2:
        raise ValueError(
            f"{fn}: {what} has dtype {x.dtype}; expected a float16/bfloat16/float32/float64 tensor"
        )
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(
            f"{fn}: {what} has shape {tuple(x.shape)}; expected at least one dim and one element"
        )


def flag_nonfinite(fn: str, what: str, shape, why: str) -> None:
    """Record an inf/nan input inside record_nonfinite(), else raise FloatingPointError."""
    if _NONFINITE_LOGS:  # recording (see record_nonfinite): note it, let the nan flow on
        _NONFINITE_LOGS[-1].append(f"{what} (shape {tuple(shape)})")
    else:
        raise FloatingPointError(f"{fn}: {what} (shape {tuple(shape)}) contains inf or nan; {why}")


def nonfinite_count() -> int:
    """How many non-finite inputs the innermost record_nonfinite() holds (0 outside one)."""
    return len(_NONFINITE_LOGS[-1]) if _NONFINITE_LOGS else 0


def quantize(
    x: torch.Tensor,
    granularity: str,
    *,
    fmt: str = "e4m3",
    block: tuple[int, int] = (1, 128),
    pow2_scales: bool = False,
    name: str | None = None,
    check_finite: bool = True,
    fused: bool | None = None,
) -> Fp8Tensor:
    """Quantize x to FP8 with float32 dequantization scales s = amax / fmt_max.

    Leading dims are flattened: a (B, T, K) or (K,) input is scaled as its (B*T, K) or
    (1, K) view, and `data` keeps the input's shape. For 2-D (M, K), scale shapes are
    () tensorwise, (M, 1) rowwise (amax along K) and (ceil(M/bm), ceil(K/bk)) blockwise,
    where `block` = (bm, bk) applies to blockwise only; partial edge blocks are allowed.

    check_finite: raise FloatingPointError on inf or nan (one device sync on CUDA); inside
        record_nonfinite() the input is recorded instead.
    fused: run the torch.compile'd quantizer; None = on CUDA only (see fused.configure).
    """
    what = name or "tensor"
    check_granularity(granularity)
    fp8_dtype(fmt)
    block = check_block(block)
    check_input(x, "quantize", what)
    x2 = x.reshape(-1, x.shape[-1])
    if fused is None:
        fused = x.is_cuda or cpu_path_on()
    if fused:
        data, scale, nonfinite = fused_quantize_2d(x2, granularity, fmt, block, bool(pow2_scales))
    else:
        data, scale, nonfinite = quantize_2d(x2, granularity, fmt, block, bool(pow2_scales))
    if check_finite and bool(nonfinite):
        flag_nonfinite("quantize", what, x.shape, "no FP8 scale can represent it")
    m, k = x2.shape
    eff_block = {"tensorwise": (m, k), "rowwise": (1, k), "blockwise": block}[granularity]
    return Fp8Tensor(data.reshape(x.shape), scale, granularity, eff_block, fmt)
