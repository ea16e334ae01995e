"""scaled_matmul: a @ b.T of two FP8 (or two block-scaled) tensors scaled along K.

On CUDA (compute capability >= 8.9; blockwise needs 9.x; MXFP8/MXFP4/NVFP4 need 10.x) it
calls torch._scaled_mm with the layouts the kernel demands; everywhere else, and for
combinations the kernel lacks, it emulates (with a one-time warning on CUDA): dequantize
both operands, float32 matmul. The emulation is exact up to that one float32 rounding of
each dequantized element and the float32 accumulation.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from .mx_cuda import block_scaled_mm, block_scaled_unsupported
from .mx_tensor import BlockScaledTensor
from .tensor import Fp8Tensor

_warned: set[str] = set()
Operand = Fp8Tensor | BlockScaledTensor


def _warn_once(why: str) -> None:
    if why not in _warned:
        _warned.add(why)
        warnings.warn(f"fp8rl: scaled_matmul emulated on CUDA: {why}", RuntimeWarning, stacklevel=3)


def scaled_matmul(
    a: Operand,
    b: Operand,
    out_dtype: torch.dtype = torch.float32,
    *,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """a (M, K) and b (N, K), both scaled along K: returns a.dequantize() @ b.dequantize().T.

    On CUDA rowwise scaling yields bfloat16 from the kernel (then cast to out_dtype).
    Block-scaled operands (`BlockScaledTensor`) must share one format.
    """
    for nm, t in (("a", a), ("b", b)):
        if not isinstance(t, (Fp8Tensor, BlockScaledTensor)):
            raise TypeError(
                f"scaled_matmul: {nm} must be an Fp8Tensor or a BlockScaledTensor, "
                f"got {type(t).__name__}"
            )
        if t.data.dim() != 2:
            raise ValueError(
                f"scaled_matmul: {nm}.data must be 2-D, got shape {tuple(t.data.shape)}"
            )
    if a.data.shape[1] != b.data.shape[1]:
        raise ValueError(
            f"scaled_matmul: contraction dims differ: a is {tuple(a.data.shape)}, "
            f"b is {tuple(b.data.shape)} (b must be (N, K))"
        )
    if a.data.device != b.data.device:
        raise ValueError(f"scaled_matmul: a is on {a.data.device}, b on {b.data.device}")
    if isinstance(a, BlockScaledTensor) != isinstance(b, BlockScaledTensor) or (
        isinstance(a, BlockScaledTensor) and a.fmt != b.fmt
    ):
        raise ValueError(
            f"scaled_matmul: a ({_kind(a)}) and b ({_kind(b)}) "
            "must both be FP8 or both of one block-scaled format"
        )
    if a.data.is_cuda:
        if isinstance(a, BlockScaledTensor):
            why = block_scaled_unsupported(a, b)
            if why is None:
                return block_scaled_mm(a, b, out_dtype)
        else:
            why = _cuda_unsupported(a, b)
            if why is None:
                return _cuda_scaled_mm(a, b, out_dtype, use_fast_accum)
        _warn_once(why)
    return emulated_scaled_matmul(a, b, out_dtype)


def _kind(t: Operand) -> str:
    return t.fmt if isinstance(t, BlockScaledTensor) else f"fp8 {t.granularity}"


def emulated_scaled_matmul(a: Operand, b: Operand, out_dtype=torch.float32) -> torch.Tensor:
    # Autocast would run this matmul in bf16: the emulation must stay float32.
    device = a.data.device.type
    if not torch.is_autocast_enabled(device):  # entering the context costs more than the check
        return (a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()).to(out_dtype)
    with torch.autocast(device, enabled=False):
        return (a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()).to(out_dtype)


def _cuda_unsupported(a: Fp8Tensor, b: Fp8Tensor) -> str | None:
    cc = torch.cuda.get_device_capability(a.data.device)
    if cc < (8, 9):
        return f"compute capability {cc} < (8, 9) has no FP8 tensor cores"
    if a.fmt == "e5m2" and b.fmt == "e5m2":
        return "e5m2 x e5m2 has no _scaled_mm kernel"
    kinds = (a.granularity, b.granularity)
    if kinds in (("tensorwise", "tensorwise"), ("rowwise", "rowwise")):
        return None
    if kinds != ("blockwise", "blockwise"):
        return f"mixed granularities {kinds}"
    if cc[0] != 9:
        return f"blockwise _scaled_mm runs on compute capability 9.x only, got {cc}"
    if a.fmt != "e4m3" or b.fmt != "e4m3":
        return f"blockwise _scaled_mm takes e4m3 only, got {a.fmt} x {b.fmt}"
    if a.block != (1, 128) or b.block not in ((1, 128), (128, 128)):
        return (
            "blockwise _scaled_mm takes 1x128 x (1x128 | 128x128) blocks, "
            f"got {a.block} x {b.block}"
        )
    if not hasattr(F, "scaled_mm"):
        return "this torch has no torch.nn.functional.scaled_mm (blockwise needs torch >= 2.10)"
    return None


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pad_rows_cols(t: Fp8Tensor, rows: int, cols: int) -> Fp8Tensor:
    """Zero-pad data to (rows, cols); padded scales are 1 (they only ever scale zeros)."""
    m, k = t.data.shape
    if (m, k) == (rows, cols):
        return t
    # Byte 0 is +0.0 in both formats; pad the bytes since F.pad has no FP8 kernels.
    data = F.pad(t.data.view(torch.uint8), (0, cols - k, 0, rows - m)).view(t.data.dtype)
    scale = t.scale
    if t.granularity == "tensorwise":
        block = (rows, cols)
    elif t.granularity == "rowwise":
        scale = F.pad(scale, (0, 0, 0, rows - m), value=1.0)
        block = (1, cols)
    else:
        block = t.block
        sm, sk = -(-rows // block[0]), -(-cols // block[1])
        scale = F.pad(scale, (0, sk - scale.shape[1], 0, sm - scale.shape[0]), value=1.0)
    return Fp8Tensor(data, scale, t.granularity, block, t.fmt)


def _cuda_scaled_mm(a: Fp8Tensor, b: Fp8Tensor, out_dtype, use_fast_accum) -> torch.Tensor:
    m, k = a.data.shape
    n = b.data.shape[0]
    # The blockwise kernel takes whole 128-blocks only, while a layer with a ragged dim (576,
    # 192) ends in a partial edge block scaled by its own amax: zeros padded into that block
    # add nothing to any dot product and leave its scale (one per block) as it is, so the
    # padded GEMM is the ragged one. Padded rows and K-blocks get scale 1 (_pad_rows_cols).
    align = 128 if a.granularity == "blockwise" else 16
    kp, np_ = _round_up(k, align), _round_up(n, align)
    # Blockwise: a's 1x128 scales are stored M-major, one column of M floats per K-block,
    # and cuBLAS reads each column 16-byte aligned; M = 16k keeps every column aligned.
    mp = _round_up(m, 16) if a.granularity == "blockwise" else m
    a = _pad_rows_cols(a, mp, kp)
    b = _pad_rows_cols(b, np_, kp)
    a_data = a.data.contiguous()  # row-major (M, K)
    b_data = b.data.contiguous().t()  # column-major (K, N), as the kernel demands
    if a.granularity == "tensorwise":
        out = torch._scaled_mm(
            a_data,
            b_data,
            scale_a=a.scale.reshape(()),
            scale_b=b.scale.reshape(()),
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    elif a.granularity == "rowwise":
        out = torch._scaled_mm(
            a_data,
            b_data,
            scale_a=a.scale.contiguous(),
            scale_b=b.scale.reshape(1, np_).contiguous(),
            out_dtype=torch.bfloat16,
            use_fast_accum=use_fast_accum,
        )
    else:
        out = _cuda_blockwise(a, a_data, b, b_data, out_dtype)
    return out[:m, :n].to(out_dtype)


def _cuda_blockwise(a, a_data, b, b_data, out_dtype):
    st = F.ScalingType
    # 1x128 scales are read outer-dim-major: stride (1, rows).
    scale_a = a.scale.t().contiguous().t()
    if b.block == (128, 128):
        # The 128x128 operand's K-block count must be padded to a multiple of 4, or the
        # kernel silently reads the wrong scales (pytorch issue 166752): (L4, N/128), stride
        # (1, L4).
        nb, kb = b.scale.shape
        padded = torch.zeros(nb, _round_up(kb, 4), dtype=torch.float32, device=b.scale.device)
        padded[:, :kb] = b.scale
        scale_b, recipe_b = padded.t(), st.BlockWise128x128
    else:
        scale_b, recipe_b = b.scale.t().contiguous().t(), st.BlockWise1x128
    return F.scaled_mm(
        a_data,
        b_data,
        scale_a,
        st.BlockWise1x128,
        scale_b,
        recipe_b,
        output_dtype=out_dtype,
    )
