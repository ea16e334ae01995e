"""An independent numpy + ml_dtypes implementation of the MXFP8 / MXFP4 / NVFP4 casts, written
from the format definitions (docs/fp8.md), sharing no code with fp8rl.fp8: block exponents
from float64 log2 (fp8rl uses frexp), element casts by ml_dtypes, float64 arithmetic where
the definition is exact and float32 where the definition fixes float32 roundings (NVFP4)."""

import math

import numpy as np


def _md():
    import ml_dtypes as md  # the tests importorskip it first

    return md


ELEM = {"mxfp8": ("float8_e4m3fn", 448.0, 8, 32), "mxfp4": ("float4_e2m1fn", 6.0, 2, 32)}


def _blocks(x: np.ndarray, k: int) -> np.ndarray:
    m, n = x.shape
    kb = -(-n // k)
    out = np.zeros((m, kb * k), dtype=x.dtype)
    out[:, :n] = x
    return out.reshape(m, kb, k)


def _cast(v: np.ndarray, dtype_name: str, vmax: float) -> np.ndarray:
    """Clamp, then ml_dtypes' round-to-nearest-even cast; back to float64."""
    return np.clip(v, -vmax, vmax).astype(getattr(_md(), dtype_name)).astype(np.float64)


def mx_reference(x: np.ndarray, fmt: str, rounding: str = "floor"):
    """(dequantized float64 values (M, K), unbiased scale exponents (M, K-blocks))."""
    name, vmax, emax, k = ELEM[fmt]
    m, n = x.shape
    xb = _blocks(x.astype(np.float64), k)
    amax = np.abs(xb).max(axis=-1)
    e = np.full(amax.shape, -127, dtype=np.int64)
    for idx in zip(*np.nonzero(amax), strict=True):
        a = float(amax[idx])
        if rounding == "floor":
            e[idx] = math.floor(math.log2(a)) - emax
        else:
            e[idx] = math.ceil(math.log2(a / vmax))
    e = np.clip(e, -127, 127)
    scale = np.ldexp(1.0, e)[..., None]
    p = _cast(xb / scale, name, vmax)
    return (p * scale).reshape(m, -1)[:, :n], e


def nvfp4_reference(x: np.ndarray):
    """(dequantized float64 values (M, K), float64 block scales s_b, float32 global scale g)."""
    f32 = np.float32
    m, n = x.shape
    xb = _blocks(x.astype(f32), 16)
    amax_b = np.abs(xb).max(axis=-1)
    amax_t = amax_b.max()
    g = f32(1.0) if amax_t == 0 else f32(amax_t) / f32(448.0 * 6.0)
    s_b = _cast((amax_b / f32(6.0) / g).astype(f32), "float8_e4m3fn", 448.0)
    s32 = s_b.astype(f32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(s32 == 0, f32(0.0), xb * ((f32(1.0) / g) / s32)).astype(f32)
    q = _cast(v, "float4_e2m1fn", 6.0)
    deq = q * s_b[..., None] * np.float64(g)
    return deq.reshape(m, -1)[:, :n], s_b, g
