"""`BlockScaledTensor`: MXFP8, MXFP4 or NVFP4 elements plus their per-block scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .mx_formats import MX_FORMATS, check_mx_format, e8m0_to_float

SCALE_DTYPES = {"e8m0": torch.float8_e8m0fnu, "e4m3": torch.float8_e4m3fn}


@dataclass
class BlockScaledTensor:
    """x ~= data * scale per block of `block_size` consecutive elements along the last dim
    (the GEMM's reduction dim) of the 2-D view (M, K) of `data`; NVFP4 also multiplies by
    the float32 `global_scale`.

    data: float8_e4m3fn, the shape of the quantized tensor. MXFP8 elements are E4M3;
        MXFP4 and NVFP4 elements are E2M1 values, each held exactly in an E4M3 byte.
    scale: (M, ceil(K / block_size)): float8_e8m0fnu powers of two (MX) or float8_e4m3fn
        (NVFP4). A K that is not a multiple of the block was zero-padded for the scales.
    """

    data: torch.Tensor
    scale: torch.Tensor
    fmt: str
    global_scale: torch.Tensor | None = None

    def __post_init__(self):
        check_mx_format(self.fmt)
        if self.data.dtype != torch.float8_e4m3fn:
            raise ValueError(
                f"BlockScaledTensor: data.dtype={self.data.dtype}, expected torch.float8_e4m3fn"
            )
        want = SCALE_DTYPES[MX_FORMATS[self.fmt][2]]
        if self.scale.dtype != want:
            raise ValueError(
                f"BlockScaledTensor: {self.fmt} scale.dtype={self.scale.dtype}, expected {want}"
            )
        if self.scale.shape != self.expected_scale_shape():
            raise ValueError(
                f"BlockScaledTensor: scale.shape={tuple(self.scale.shape)} does not fit data "
                f"of shape {tuple(self.data.shape)} (expected {tuple(self.expected_scale_shape())})"
            )
        needs_global = self.fmt == "nvfp4"
        has_global = self.global_scale is not None
        if has_global != needs_global or (
            has_global and (self.global_scale.dtype != torch.float32 or self.global_scale.dim())
        ):
            raise ValueError(
                f"BlockScaledTensor: {self.fmt} needs "
                + ("a 0-d float32 global_scale" if needs_global else "global_scale=None")
            )

    @property
    def block_size(self) -> int:
        return MX_FORMATS[self.fmt][1]

    @property
    def elem(self) -> str:
        """The element format: 'e4m3' or 'e2m1'."""
        return MX_FORMATS[self.fmt][0]

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def rows_cols(self) -> tuple[int, int]:
        k = self.data.shape[-1]
        return (self.data.numel() // k if k else 0, k)

    def expected_scale_shape(self) -> torch.Size:
        m, k = self.rows_cols
        return torch.Size((m, -(-k // self.block_size)))

    def block_scales(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Each block's whole scale in `dtype`, (M, K-blocks). NVFP4 multiplies the global
        scale in first (g * s_b, as torchao and NVIDIA's kernels do), exact in float64."""
        if self.global_scale is None:
            return e8m0_to_float(self.scale, dtype)
        return self.global_scale.to(dtype) * self.scale.to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """data * scale in `dtype` (float64 gives the exact values; float32 rounds NVFP4's
        g * s_b once and is exact for MX)."""
        m, k = self.rows_cols
        kb, bk = self.scale.shape[1], self.block_size
        work = torch.float64 if dtype == torch.float64 else torch.float32
        x = F.pad(self.data.reshape(m, k).to(work), (0, kb * bk - k)).reshape(m, kb, bk)
        x = (x * self.block_scales(work)[:, :, None]).reshape(m, kb * bk)[:, :k]
        return x.reshape(self.data.shape).to(dtype)

    def to(self, device) -> BlockScaledTensor:
        g = self.global_scale.to(device) if self.global_scale is not None else None
        return BlockScaledTensor(self.data.to(device), self.scale.to(device), self.fmt, g)
