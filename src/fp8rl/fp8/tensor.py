"""`Fp8Tensor`: FP8 data plus the float32 dequantization scales that go with it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .formats import FORMATS, check_granularity, fp8_to_float32


@dataclass
class Fp8Tensor:
    """x ~= data * scale, where scale[i, j] covers rows i*block[0]... and cols j*block[1]...
    of the 2-D view (M, K) of `data` (leading dims flattened into M).

    `block` is the area one scale covers: (M, K) for tensorwise, (1, K) for rowwise, and
    the quantization block for blockwise. Scales are dequantization scales (amax / fmt_max),
    the convention torch._scaled_mm takes.
    """

    data: torch.Tensor
    scale: torch.Tensor
    granularity: str
    block: tuple[int, int]
    fmt: str = "e4m3"
    # dequantize(float32), kept by with_dequantized(): the CPU emulation reuses a weight's
    # values over every GEMM of one weight version instead of recomputing them per call
    dequantized: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        check_granularity(self.granularity)
        if self.fmt not in FORMATS or self.data.dtype != FORMATS[self.fmt]:
            raise ValueError(
                f"Fp8Tensor: fmt={self.fmt!r} does not match data.dtype={self.data.dtype}"
            )
        if self.scale.dtype != torch.float32:
            raise ValueError(f"Fp8Tensor: scale.dtype={self.scale.dtype}, expected torch.float32")
        if self.scale.shape != self.expected_scale_shape():
            raise ValueError(
                f"Fp8Tensor: scale.shape={tuple(self.scale.shape)} does not fit a "
                f"{self.granularity} tensor of shape {tuple(self.data.shape)} "
                f"(expected {tuple(self.expected_scale_shape())})"
            )

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def rows_cols(self) -> tuple[int, int]:
        """(M, K) of the 2-D view the scales refer to."""
        k = self.data.shape[-1]
        return (self.data.numel() // k if k else 0, k)

    def expected_scale_shape(self) -> torch.Size:
        m, k = self.rows_cols
        if self.granularity == "tensorwise":
            return torch.Size(())
        if self.granularity == "rowwise":
            return torch.Size((m, 1))
        bm, bk = self.block
        return torch.Size((-(-m // bm), -(-k // bk)))

    def full_scale(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The scale of every element of the 2-D view, (M, K) (or broadcastable to it)."""
        s = self.scale.to(dtype)
        if self.granularity != "blockwise":
            return s
        m, k = self.rows_cols
        bm, bk = self.block
        return s.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """data * scale in `dtype` (float64 gives the exact value, float32 rounds once)."""
        if self.dequantized is not None and dtype == torch.float32:
            return self.dequantized
        m, k = self.rows_cols
        if dtype == torch.float64:
            x = self.data.reshape(m, k).to(torch.float64) * self.full_scale(torch.float64)
        else:
            x = fp8_to_float32(self.data.reshape(m, k)).mul_(self.full_scale(torch.float32))
        return x.reshape(self.data.shape).to(dtype)

    def with_dequantized(self) -> Fp8Tensor:
        """This tensor with its float32 dequantized values computed once and kept."""
        if self.dequantized is not None:
            return self
        out = object.__new__(Fp8Tensor)  # checked already: no second __post_init__ per call
        out.__dict__.update(self.__dict__, dequantized=self.dequantize(torch.float32))
        return out

    def t_cached(self) -> Fp8Tensor:
        """t(), computed once per tensor: a cached weight's transpose for the grad-input GEMM."""
        memo = self.__dict__.get("_t_memo")
        if memo is None:
            memo = self.__dict__["_t_memo"] = self.t()
        return memo

    def to(self, device) -> Fp8Tensor:
        return Fp8Tensor(
            self.data.to(device), self.scale.to(device), self.granularity, self.block, self.fmt
        )

    def t(self) -> Fp8Tensor:
        """The transposed 2-D tensor, exactly as quantizing x.t() would give it.

        Valid for tensorwise and blockwise (a block's amax does not depend on orientation);
        a rowwise tensor must be re-quantized from its source instead.
        """
        if self.data.dim() != 2:
            raise ValueError(f"Fp8Tensor.t(): data must be 2-D, got shape {tuple(self.data.shape)}")
        if self.granularity == "rowwise":
            raise ValueError(
                "Fp8Tensor.t(): a rowwise tensor has its scales along the other dim; "
                "quantize the transposed source instead"
            )
        scale = self.scale if self.granularity == "tensorwise" else self.scale.t().contiguous()
        deq = self.dequantized
        return Fp8Tensor(
            self.data.t().contiguous(),
            scale,
            self.granularity,
            (self.block[1], self.block[0]),
            self.fmt,
            # an elementwise product commutes with the transpose: the same values, and the
            # same (contiguous) layout the GEMM would get from dequantizing the result
            dequantized=None if deq is None else deq.t().contiguous(),
        )
