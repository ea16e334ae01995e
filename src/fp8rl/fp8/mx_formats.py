"""The microscaled formats MXFP8, MXFP4 and NVFP4: element casts and block scales.

Exact in float32 arithmetic, with no float64 and no Python loops: exponents come from
torch.frexp (exact, subnormals included), never from log2, whose float32 result can be an
ulp off near powers of two and so pick the wrong scale.
"""

from __future__ import annotations

import torch

from .formats import saturating_cast

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 255
NVFP4_GLOBAL_DIVISOR = (
    E4M3_MAX * E2M1_MAX
)  # 2688: the largest block scale times the largest element

# name -> (element format, block size, scale type)
MX_FORMATS: dict[str, tuple[str, int, str]] = {
    "mxfp8": ("e4m3", 32, "e8m0"),
    "mxfp4": ("e2m1", 32, "e8m0"),
    "nvfp4": ("e2m1", 16, "e4m3"),
}
# floor(log2(max element)): 8 for E4M3 (448 = 1.75 * 2^8), 2 for E2M1 (6 = 1.5 * 2^2)
ELEMENT_EMAX = {"e4m3": 8, "e2m1": 2}
# max element = mm * 2^em, mm in [0.5, 1): 448 = 0.875 * 2^9, 6 = 0.75 * 2^3
ELEMENT_MAX_FREXP = {"e4m3": (0.875, 9), "e2m1": (0.75, 3)}
SCALE_ROUNDINGS = ("floor", "rceil")


def check_mx_format(fmt: str) -> str:
    if fmt not in MX_FORMATS:
        raise ValueError(
            f"fmt={fmt!r} is not a block-scaled format: expected one of {list(MX_FORMATS)}"
        )
    return fmt


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """float32 v -> the nearest E2M1 value (ties to even), saturating at +-6; NaN stays NaN.

    E2M1's values are 0, 0.5, 1, 1.5, 2, 3, 4, 6: the spacing is 0.5 below 2 (subnormals
    included), 1 in [2, 4) and 2 in [4, 6]. Dividing by that power-of-two quantum is exact,
    and torch.round rounds half to even, which is E2M1's tie rule: an odd multiple of the
    quantum is an odd mantissa.
    """
    v = v.float().clamp(-E2M1_MAX, E2M1_MAX)
    _, e = torch.frexp(v)  # |v| in [2^(e-1), 2^e)
    quantum = torch.ldexp(torch.ones_like(v), e.clamp_min(1) - 2)
    return torch.round(v / quantum) * quantum


def element_cast(v: torch.Tensor, elem: str) -> torch.Tensor:
    """Saturating round-to-nearest-even cast of float32 v to the element format, held in a
    float8_e4m3fn tensor (every E2M1 value is exact in E4M3: one byte per element here;
    packing two E2M1 per byte is the GPU kernel's business)."""
    if elem == "e2m1":
        return e2m1_round(v).to(torch.float8_e4m3fn)
    return saturating_cast(v, "e4m3")


def e8m0_exponent(amax: torch.Tensor, elem: str, rounding: str) -> torch.Tensor:
    """The unbiased int32 exponent e of each block's scale X = 2^e, clamped to [-127, 127].

    floor (OCP): e = floor(log2(amax)) - emax_elem; rceil (NVIDIA): e = ceil(log2(amax / max)),
    the smallest X with amax / X <= max. An all-zero block gets -127. Non-finite amax is the
    caller's to flag (see e8m0_bits).
    """
    mant, exp = torch.frexp(amax.float())  # amax = mant * 2^exp, mant in [0.5, 1) if amax > 0
    if rounding == "floor":
        e = exp - 1 - ELEMENT_EMAX[elem]
    else:
        # max = mm * 2^em with mm in [0.5, 1): amax / max = (mant / mm) * 2^(exp - em) with
        # mant / mm in (0.5, 2), so ceil(log2(amax / max)) = exp - em + (mant > mm), exactly
        # (no float32 quotient, whose rounding can land on a power of two).
        mm, em = ELEMENT_MAX_FREXP[elem]
        e = exp - em + (mant > mm).to(torch.int32)
    e = torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS))
    return e.clamp(-E8M0_BIAS, E8M0_BIAS)


def e8m0_bits(e: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """float8_e8m0fnu scales 2^e; NaN (0xFF) where amax is not finite."""
    biased = torch.where(torch.isfinite(amax), e + E8M0_BIAS, torch.full_like(e, E8M0_NAN))
    return biased.to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_to_float(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """2^(bits - 127) in `dtype` (NaN for 0xFF); exact in float32, 2^-127 being a subnormal."""
    bits = scale.view(torch.uint8).to(torch.int32)
    one = torch.ones(bits.shape, dtype=dtype, device=bits.device)
    out = torch.ldexp(one, bits - E8M0_BIAS)
    return torch.where(bits == E8M0_NAN, torch.full_like(out, float("nan")), out)


def nvfp4_global_scale(amax_t: torch.Tensor) -> torch.Tensor:
    """g = amax_t / 2688 in float32 (1 for an all-zero tensor; NaN/inf stay, to be flagged)."""
    amax_t = amax_t.float()
    return torch.where(amax_t == 0, torch.ones_like(amax_t), amax_t / NVFP4_GLOBAL_DIVISOR)


def nvfp4_block_scale(amax_b: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """s_b = E4M3(amax_b / 6 / g), round to nearest even into E4M3's subnormals, saturating
    at 448; 0 for an all-zero block."""
    return saturating_cast(amax_b.float() / E2M1_MAX / g, "e4m3")
