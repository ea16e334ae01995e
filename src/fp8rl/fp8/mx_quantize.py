"""Quantization of a high-precision tensor to MXFP8, MXFP4 or NVFP4 along its last dim."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .mx_formats import (
    MX_FORMATS,
    SCALE_ROUNDINGS,
    check_mx_format,
    e8m0_bits,
    e8m0_exponent,
    element_cast,
    nvfp4_block_scale,
    nvfp4_global_scale,
)
from .mx_tensor import BlockScaledTensor
from .quantize import check_input, flag_nonfinite


def _blocks(x2: torch.Tensor, k: int) -> torch.Tensor:
    """(M, K) -> (M, ceil(K / k), k) in float32, zero-padded: zeros raise no block's amax."""
    m, n = x2.shape
    kb = -(-n // k)
    return F.pad(x2.float(), (0, kb * k - n)).reshape(m, kb, k)


def _mx(xb: torch.Tensor, elem: str, rounding: str):
    amax = xb.abs().amax(dim=-1)
    e = e8m0_exponent(amax, elem, rounding)
    # v / 2^e by ldexp: exact, where a float32 division by the subnormal 2^-127 might not be.
    data = element_cast(torch.ldexp(xb, -e[..., None]), elem)
    return data, e8m0_bits(e, amax), None, amax


def _nvfp4(xb: torch.Tensor):
    amax = xb.abs().amax(dim=-1)
    g = nvfp4_global_scale(amax.amax())
    s_b = nvfp4_block_scale(amax, g)
    sf = s_b.float()[..., None]
    # x * ((1 / g) / s_b): the order of torchao's NVFP4Tensor and NVIDIA's kernels, so the
    # float32 roundings agree bit for bit. A zero block scale (an all-zero block, or one
    # below E4M3's range relative to the tensor) gives zero elements; a NaN scale stays NaN.
    v = torch.where(sf == 0, torch.zeros_like(xb), xb * ((1.0 / g) / sf))
    return element_cast(v, "e2m1"), s_b, g, amax


def quantize_mx(
    x: torch.Tensor,
    fmt: str,
    *,
    scale_rounding: str = "floor",
    name: str | None = None,
    check_finite: bool = True,
) -> BlockScaledTensor:
    """Quantize x to a block-scaled format along its last dim (leading dims flattened).

    fmt: 'mxfp8' (E4M3 elements, one E8M0 scale per 32), 'mxfp4' (E2M1, E8M0 per 32) or
        'nvfp4' (E2M1, an E4M3 scale per 16 and one float32 scale for the whole tensor).
    scale_rounding: MX only: 'floor' (OCP: elements may saturate) or 'rceil' (NVIDIA: the
        smallest power of two that fits the block's amax).
    check_finite: an inf/nan input raises FloatingPointError (its block scale is NaN);
        inside record_nonfinite() it is recorded instead and the NaN flows on.
    """
    what = name or "tensor"
    check_mx_format(fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(
            f"quantize_mx: scale_rounding={scale_rounding!r} is invalid: "
            f"expected one of {list(SCALE_ROUNDINGS)}"
        )
    check_input(x, "quantize_mx", what)
    elem, k, _ = MX_FORMATS[fmt]
    x2 = x.reshape(-1, x.shape[-1])
    m, n = x2.shape
    xb = _blocks(x2, k)
    if fmt == "nvfp4":
        data, scale, g, amax = _nvfp4(xb)
    else:
        data, scale, g, amax = _mx(xb, elem, scale_rounding)
    if check_finite and not bool(torch.isfinite(amax).all()):
        flag_nonfinite("quantize_mx", what, x.shape, f"no {fmt} block scale can represent it")
    data = data.reshape(m, -1)[:, :n].reshape(x.shape).contiguous()
    return BlockScaledTensor(data, scale.contiguous(), fmt, g)
