"""Block-scaled GEMMs on Blackwell-class (SM100) tensor cores via torch.nn.functional.scaled_mm.

Not run on hardware yet: no SM100 GPU has been available to the project. The argument
shapes are checked on the CPU's meta device (which applies scaled_mm's CUDA checks), the
scale layout and the E2M1 packing against torchao's, and bench/gpu_fp8_linear.py checks
the results against the emulation on any GPU that takes this path. Everywhere else
(the H200 included, SM90 having no block-scaled tensor cores) `scaled_matmul` emulates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .mx_tensor import BlockScaledTensor


def block_scaled_unsupported(a: BlockScaledTensor, b: BlockScaledTensor) -> str | None:
    """Why the block-scaled kernel cannot take (a, b) here, or None when it can."""
    cc = torch.cuda.get_device_capability(a.data.device)
    if cc < (10, 0):
        return (
            f"compute capability {cc} has no block-scaled tensor cores (SM100+), {a.fmt} emulated"
        )
    st = getattr(F, "ScalingType", None)
    if not hasattr(F, "scaled_mm") or not hasattr(F, "SwizzleType") or st is None:
        return "this torch has no torch.nn.functional.scaled_mm with block scales"
    if not hasattr(st, "BlockWise1x32") or not hasattr(st, "BlockWise1x16"):
        return "this torch's scaled_mm has no BlockWise1x32 / BlockWise1x16 scaling"
    return None


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """(rows, K-blocks) scales in cuBLAS's block-scaling layout, flattened: zero-padded to
    128-row x 4-column tiles, tiles row-major, and within a tile the scale of (row r, col c)
    at offset (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scale.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    padded = torch.zeros(rb * 128, cb * 4, dtype=torch.uint8, device=scale.device)
    padded[:rows, :cols] = scale.view(torch.uint8)
    # r = (tile row, r // 32 within the tile, r % 32), c = (tile col, c % 4)
    tiles = padded.view(rb, 4, 32, cb, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(-1).view(scale.dtype)


def pack_e2m1(values: torch.Tensor) -> torch.Tensor:
    """E2M1 values (exact, held in any float dtype), (M, K) with K even -> (M, K / 2)
    float4_e2m1fn_x2: codes sign | exponent (2 bits) | mantissa (1 bit), element 2i in the
    low nibble of byte i."""
    v = values.float()
    mag = v.abs()
    # 0, .5, 1, 1.5 -> 0..3 (2 |v|); 2, 3 -> 4, 5 (|v| + 2); 4, 6 -> 6, 7 (|v| / 2 + 4)
    code = torch.where(mag < 2, mag * 2, torch.where(mag < 4, mag + 2, mag / 2 + 4))
    code = code.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)


def _operand(t: BlockScaledTensor, rows: int, cols: int):
    """Data zero-padded to (rows, cols) in the kernel's element dtype, and swizzled scales."""
    m, k = t.data.shape
    data = F.pad(t.data.view(torch.uint8), (0, cols - k, 0, rows - m)).view(t.data.dtype)
    if t.elem == "e2m1":
        data = pack_e2m1(data)
    return data, swizzle_scales(t.scale)


def block_scaled_mm(a: BlockScaledTensor, b: BlockScaledTensor, out_dtype) -> torch.Tensor:
    """a (M, K) @ b (N, K).T on the block-scaled tensor cores; NVFP4's two global scales
    multiply the float32 result afterwards (the single-level kernel takes block scales only)."""
    m, k = a.data.shape
    n = b.data.shape[0]
    kp, np_ = -(-k // 32) * 32, -(-n // 16) * 16  # packed E2M1 rows must be 16-byte aligned
    st, sw = F.ScalingType, F.SwizzleType.SWIZZLE_32_4_4
    recipe = st.BlockWise1x16 if a.fmt == "nvfp4" else st.BlockWise1x32
    a_data, a_scale = _operand(a, m, kp)
    b_data, b_scale = _operand(b, np_, kp)
    out = F.scaled_mm(
        a_data,
        b_data.t(),
        a_scale,
        recipe,
        b_scale,
        recipe,
        swizzle_a=sw,
        swizzle_b=sw,
        output_dtype=torch.float32,
    )[:, :n]
    if a.global_scale is not None:
        out = out * (a.global_scale * b.global_scale)
    return out.to(out_dtype)
