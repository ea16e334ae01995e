"""The eager FP8 quantization kernels: amax, dequantization scale and saturating cast of a 2-D
tensor, one function per granularity. A leaf: `quantize` runs them eagerly, `fused` compiles
them, and neither imports the other for them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .formats import fmt_max, saturating_cast

AMAX_FLOOR = 1e-12


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
    if x.is_cuda:
        amax = xf.abs().amax()
    else:  # one pass instead of two; NaN propagates through both
        lo, hi = torch.aminmax(xf)
        amax = torch.maximum(-lo, hi)
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
