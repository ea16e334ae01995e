"""The two FP8 formats, their ranges, and the saturating cast every quantizer goes through."""

from __future__ import annotations

import torch

from ..utils import host_list

FORMATS: dict[str, torch.dtype] = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}

GRANULARITIES = ("tensorwise", "rowwise", "blockwise")


def fp8_dtype(fmt: str) -> torch.dtype:
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(
            f"fmt={fmt!r} is not an FP8 format: expected one of {sorted(FORMATS)}"
        ) from None


_FMT_MAX = {fmt: float(torch.finfo(dtype).max) for fmt, dtype in FORMATS.items()}


def fmt_max(fmt: str) -> float:
    """Largest finite value of the format (448 for e4m3, 57344 for e5m2)."""
    try:
        return _FMT_MAX[fmt]
    except (KeyError, TypeError):
        fp8_dtype(fmt)  # raises the error naming the formats
        raise


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(
            f"granularity={granularity!r} is invalid: expected one of {list(GRANULARITIES)}"
        )
    return granularity


def check_block(block, field: str = "block") -> tuple[int, int]:
    ok = (
        isinstance(block, (tuple, list))
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    )
    if not ok:
        raise ValueError(f"{field}={block!r} is invalid: expected two positive ints (rows, cols)")
    return (int(block[0]), int(block[1]))


def fp8_to_float32(data: torch.Tensor) -> torch.Tensor:
    """`data.to(torch.float32)`, bit for bit (NaNs included), for an e4m3 or e5m2 tensor.

    torch's CPU cast from e4m3fn converts one element at a time: 3-6x slower than this on
    the study's shapes. Small tensors look their bytes up in a 256-entry table of torch's
    own casts. Large ones use integer arithmetic: an e4m3fn byte s.eeee.mmm moved into
    float16 as s.0eeee.mmm0000000 is its value / 256, subnormals included (in place: fresh
    large temporaries cost page faults). e5m2 is the top byte of a float16: torch is fast.
    """
    if data.dtype != torch.float8_e4m3fn or data.is_cuda:
        return data.to(torch.float32)
    u = data.view(torch.uint8)
    if data.numel() <= _TABLE_MAX:
        return torch.take(_E4M3_TABLE, u.long()).reshape(data.shape)
    b = u.to(torch.int16)
    low = b & 0x7F
    h = b.bitwise_and_(0x80).bitwise_left_shift_(8).bitwise_or_(low.bitwise_left_shift(7))
    out = h.view(torch.float16).to(torch.float32).mul_(256.0)
    if host_list(low.max()) == 0x7F:  # NaN codes (a non-finite input); max beats any(==)
        out = torch.where(low == 0x7F, _E4M3_TABLE[u.long()], out)
    return out


# every e4m3fn byte's float32 value, as torch casts it; below _TABLE_MAX elements a lookup
# beats the integer path's half-dozen passes (measured on the 2-core study machine)
_E4M3_TABLE = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
_TABLE_MAX = 16384


def saturating_cast(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Clamp to [-max, max], then cast.

    The clamp is not redundant: torch on the CPU saturates e4m3fn but turns e5m2 overflow
    into inf, and eager CUDA casts in torch <= 2.11 saturate neither.
    """
    # eager on the CPU, the clamp would be one more pass over x that changes nothing; compiled
    # code converts with its own kernels, whose saturation this probe does not speak for
    if (
        fmt == "e4m3"
        and _CPU_E4M3_SATURATES
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
    ):
        return x.to(torch.float8_e4m3fn)
    m = fmt_max(fmt)
    return x.clamp(-m, m).to(fp8_dtype(fmt))


def _cpu_e4m3_saturates() -> bool:
    """Does this torch's CPU cast to e4m3fn saturate (overflow and inf to +-448, NaN kept)?"""
    probe = torch.tensor([448.0, 464.0, 1e30, float("inf"), -1e30, float("-inf"), float("nan")])
    got = probe.to(torch.float8_e4m3fn).float().tolist()
    return got[:6] == [448.0, 448.0, 448.0, 448.0, -448.0, -448.0] and got[6] != got[6]


_CPU_E4M3_SATURATES = _cpu_e4m3_saturates()
