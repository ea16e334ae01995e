"""Quantization of a high-precision tensor to FP8 at one of three granularities."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from .formats import check_block, check_granularity, fmt_max, fp8_dtype, saturating_cast
from .tensor import Fp8Tensor

AMAX_FLOOR = 1e-12
FUSED_ON_CPU = False  # set by fused.configure(cpu=True): CPU runs that trace the GPU's path


def scale_from_amax(amax: torch.Tensor, fmt: str, pow2: bool) -> torch.Tensor:
    """Dequantization scale amax / fmt_max in float32, optionally rounded up to 2^k.

    NaN and inf amax give NaN and inf scales (clamp propagates NaN), so a skipped
    finiteness check still cannot produce a finite, wrong scale.
    """
    s = amax.float().clamp_min(AMAX_FLOOR) / fmt_max(fmt)
    if pow2:
        p = torch.exp2(torch.ceil(torch.log2(s)))
        # log2 may be off by one ulp near powers of two: fix the exponent both ways.
        p = torch.where(p * 0.5 >= s, p * 0.5, p)
        s = torch.where(p < s, p * 2.0, p)
    return s


def _tensorwise(x: torch.Tensor, fmt: str, pow2: bool):
    xf = x.float()
    amax = xf.abs().amax()
    s = scale_from_amax(amax, fmt, pow2)
    return saturating_cast(xf / s, fmt).contiguous(), s, ~torch.isfinite(amax)


def _rowwise(x: torch.Tensor, fmt: str, pow2: bool):
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True)
    s = scale_from_amax(amax, fmt, pow2)
    return saturating_cast(xf / s, fmt).contiguous(), s, ~torch.isfinite(amax).all()


def _blockwise(x: torch.Tensor, fmt: str, block: tuple[int, int], pow2: bool):
    m, k = x.shape
    bm, bk = block
    mb, kb = -(-m // bm), -(-k // bk)
    # Zero padding leaves every block's amax unchanged.
    xb = F.pad(x.float(), (0, kb * bk - k, 0, mb * bm - m)).reshape(mb, bm, kb, bk)
    amax = xb.abs().amax(dim=(1, 3))
    s = scale_from_amax(amax, fmt, pow2)
    data = saturating_cast(xb / s[:, None, :, None], fmt).reshape(mb * bm, kb * bk)[:m, :k]
    return data.contiguous(), s, ~torch.isfinite(amax).all()


# One function per granularity: each compiles on its own (fewer recompiles per code object).
KERNELS = {"tensorwise": _tensorwise, "rowwise": _rowwise, "blockwise": _blockwise}


def quantize_2d(x: torch.Tensor, granularity: str, fmt: str, block: tuple[int, int], pow2: bool):
    """(data, scale, nonfinite) of a 2-D x, eager."""
    if granularity == "blockwise":
        return _blockwise(x, fmt, block, pow2)
    return KERNELS[granularity](x, fmt, pow2)


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
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize: {what} must be a torch.Tensor, got {type(x).__name__}")
    check_granularity(granularity)
    fp8_dtype(fmt)
    block = check_block(block)
    if not x.is_floating_point() or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(
            f"quantize: {what} has dtype {x.dtype}; "
            "expected a float16/bfloat16/float32/float64 tensor"
        )
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(
            f"quantize: {what} has shape {tuple(x.shape)}; "
            "expected at least one dim and one element"
        )
    x2 = x.reshape(-1, x.shape[-1])
    if fused is None:
        fused = x.is_cuda or FUSED_ON_CPU
    if fused:
        from .fused import fused_quantize_2d

        data, scale, nonfinite = fused_quantize_2d(x2, granularity, fmt, block, bool(pow2_scales))
    else:
        data, scale, nonfinite = quantize_2d(x2, granularity, fmt, block, bool(pow2_scales))
    if check_finite and bool(nonfinite):
        if _NONFINITE_LOGS:  # recording (see record_nonfinite): note it, let the nan flow on
            _NONFINITE_LOGS[-1].append(f"{what} (shape {tuple(x.shape)})")
        else:
            raise FloatingPointError(
                f"quantize: {what} (shape {tuple(x.shape)}) contains inf or nan; "
                "no FP8 scale can represent it"
            )
    m, k = x2.shape
    eff_block = {"tensorwise": (m, k), "rowwise": (1, k), "blockwise": block}[granularity]
    return Fp8Tensor(data.reshape(x.shape), scale, granularity, eff_block, fmt)
