"""The two FP8 formats, their ranges, and the saturating cast every quantizer goes through."""

from __future__ import annotations

import torch

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


def fmt_max(fmt: str) -> float:
    """Largest finite value of the format (448 for e4m3, 57344 for e5m2)."""
    return float(torch.finfo(fp8_dtype(fmt)).max)


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


def saturating_cast(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Clamp to [-max, max], then cast.

    The clamp is not redundant: torch on the CPU saturates e4m3fn but turns e5m2 overflow
    into inf, and eager CUDA casts in torch <= 2.11 saturate neither.
    """
    m = fmt_max(fmt)
    return x.clamp(-m, m).to(fp8_dtype(fmt))
