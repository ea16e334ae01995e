"""`Fp8Linear`: an nn.Linear whose three GEMMs run in FP8 (or MXFP8) when it has a recipe, or
whose forward runs in 4 bits (MXFP4, NVFP4) with a high-precision backward."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .input_memo import memo_quantize
from .matmul import Operand, scaled_matmul
from .mx_quantize import quantize_mx
from .mx_tensor import BlockScaledTensor
from .quantize import flag_nonfinite, quantize
from .recipe import Fp8Recipe, as_recipe
from .tensor import Fp8Tensor


def quantize_operand(
    x2: torch.Tensor, recipe: Fp8Recipe, *, fmt: str, weight: bool, name: str
) -> Operand:
    """Quantize a GEMM operand laid out (rows, contraction) as the recipe says.

    Off CUDA an FP8 GEMM is emulated on the dequantized values: they are computed here, once,
    and travel with the operand (into its transpose and the backward) instead of being
    recomputed by every GEMM that reads it.
    """
    if recipe.block_format:
        return quantize_mx(
            x2,
            recipe.block_format,
            scale_rounding=recipe.scale_rounding,
            name=name,
            check_finite=recipe.check_finite,
        )
    q = quantize(
        x2,
        recipe.granularity,
        fmt=fmt,
        block=recipe.weight_block if weight else recipe.act_block,
        pow2_scales=recipe.pow2_scales,
        name=name,
        check_finite=recipe.check_finite,
    )
    return q if q.data.is_cuda else q.with_dequantized()


def _what(label: str | None, operand: str) -> str:
    """An operand's name in FP8 errors and non-finite records: the layer's, when it has one."""
    return f"{label}: Fp8Linear {operand}" if label else f"Fp8Linear {operand}"


def _transposable(recipe: Fp8Recipe, block: tuple[int, int]) -> bool:
    """True when the transpose of a quantized operand equals quantizing the transpose.

    Tensorwise always; blockwise when the block is square (its amax is orientation-free).
    Otherwise (rowwise, MX: scales run along one dim) they are recomputed along the new
    contraction dim.
    """
    return recipe.granularity == "tensorwise" or (
        recipe.granularity == "blockwise" and block[0] == block[1]
    )


# Quantized operands go through save_for_backward (saved-tensor hooks see them) as three
# tensors (data, scale, NVFP4's global scale); the meta rebuilds them.
# An Fp8Tensor's third is its kept float32 values (the CPU emulation's), if any.
def _pack(t: Operand | None) -> tuple[tuple, tuple | None]:
    if t is None:
        return (None, None, None), None
    if isinstance(t, Fp8Tensor):
        return (t.data, t.scale, t.dequantized), (t.granularity, t.block, t.fmt)
    return (t.data, t.scale, t.global_scale), (t.fmt,)


def _unpack(tensors, meta) -> Operand | None:
    if meta is None:
        return None
    if len(meta) == 1:
        return BlockScaledTensor(tensors[0], tensors[1], meta[0], tensors[2])
    return Fp8Tensor(tensors[0], tensors[1], *meta, dequantized=tensors[2])


class _Fp8LinearFn(torch.autograd.Function):
    """y = q(x) q(W)^T;  dx = q(dy) q(W);  dW = q(dy)^T q(x), each q along its GEMM's K."""

    @staticmethod
    def forward(ctx, x2, weight, recipe: Fp8Recipe, wq: Operand, out_dtype, label, xq):
        r = recipe
        y = scaled_matmul(xq, wq, out_dtype, use_fast_accum=r.use_fast_accum)

        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        xt = None
        if need_dw:
            # x^T (K, M) quantized along the tokens, computed now so only FP8 is kept.
            if _transposable(r, r.act_block):
                xt = xq.t_cached()  # shared by the layers that share xq (input_memo)
            else:
                xt = quantize_operand(
                    x2.t(), r, fmt=r.fwd_fmt, weight=False, name=_what(label, "input (grad weight)")
                )
        wt_ready = need_dx and _transposable(r, r.weight_block)
        ctx.recipe, ctx.x_dtype, ctx.w_dtype, ctx.label = r, x2.dtype, weight.dtype, label
        xt_tensors, xt_meta = _pack(xt)
        wq_tensors, wq_meta = _pack(wq if wt_ready else None)
        ctx.save_for_backward(
            weight if need_dx and not wt_ready else None, *xt_tensors, *wq_tensors
        )
        ctx.meta = (xt_meta, wq_meta)
        # the weight's cached transpose (CPU emulation): one per weight version, not per call
        ctx.wq = wq if wt_ready and getattr(wq, "dequantized", None) is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        r: Fp8Recipe = ctx.recipe
        saved = ctx.saved_tensors
        weight, xt, wq = (
            saved[0],
            _unpack(saved[1:4], ctx.meta[0]),
            _unpack(saved[4:7], ctx.meta[1]),
        )
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = None
        dyq = None
        if need_dx:
            dyq = quantize_operand(
                dy, r, fmt=r.grad_fmt, weight=False, name=_what(ctx.label, "grad_output")
            )
            if ctx.wq is not None:
                wt = ctx.wq.t_cached()
            elif wq is not None:
                wt = wq.t()
            else:
                wt = quantize_operand(
                    weight.t(),
                    r,
                    fmt=r.fwd_fmt,
                    weight=True,
                    name=_what(ctx.label, "weight (grad input)"),
                )
            dx = scaled_matmul(dyq, wt, ctx.x_dtype)
        if need_dw:
            if dyq is not None and _transposable(r, r.act_block):
                dyt = dyq.t()
            else:
                dyt = quantize_operand(
                    dy.t(),
                    r,
                    fmt=r.grad_fmt,
                    weight=False,
                    name=_what(ctx.label, "grad_output (grad weight)"),
                )
            dw = scaled_matmul(dyt, xt, ctx.w_dtype)
        return dx, dw, None, None, None, None, None


class _HpBackwardFn(torch.autograd.Function):
    """y = q(x) q(W)^T;  dx = dy deq(q(W));  dW = dy^T deq(q(x)) in float32: a quantized
    forward with a straight-through backward on the forward's own quantized operands."""

    @staticmethod
    def forward(ctx, x2, weight, recipe: Fp8Recipe, wq: Operand, out_dtype, label, xq):
        r = recipe
        y = scaled_matmul(xq, wq, out_dtype, use_fast_accum=r.use_fast_accum)
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.recipe, ctx.x_dtype, ctx.w_dtype, ctx.label = r, x2.dtype, weight.dtype, label
        xq_tensors, xq_meta = _pack(xq if need_dw else None)
        wq_tensors, wq_meta = _pack(wq if need_dx else None)
        ctx.save_for_backward(*xq_tensors, *wq_tensors)
        ctx.meta = (xq_meta, wq_meta)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        xq, wq = _unpack(saved[0:3], ctx.meta[0]), _unpack(saved[3:6], ctx.meta[1])
        if ctx.recipe.check_finite and not bool(torch.isfinite(dy).all()):
            # dy enters no quantizer here, so it is checked as a quantizer would check it.
            flag_nonfinite(
                "Fp8Linear", _what(ctx.label, "grad_output"), dy.shape, "the gradients are lost"
            )
        dx = dw = None
        with torch.autocast(dy.device.type, enabled=False):
            dyf = dy.float()
            if wq is not None:
                dx = (dyf @ wq.dequantize(torch.float32)).to(ctx.x_dtype)
            if xq is not None:
                dw = (dyf.t() @ xq.dequantize(torch.float32)).to(ctx.w_dtype)
        return dx, dw, None, None, None, None, None


class Fp8Linear(nn.Linear):
    """nn.Linear with the same parameters (state_dicts are interchangeable), computing in FP8.

    recipe: an Fp8Recipe, or None for plain high precision (exactly F.linear).
    The quantized weight is cached, keyed by (weight._version, weight.data_ptr(), recipe):
    in-place optimizer updates bump the version and trigger one re-quantization, counted
    by `weight_quantizations`. Writes through `weight.data` bypass the version counter:
    call `invalidate_weight_cache()` after them.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        recipe=None,
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = as_recipe(recipe)
        self.weight_quantizations = 0
        self._wcache: tuple | None = None
        self.label: str | None = None  # the module's name in its model (set by convert_to_fp8)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe=None) -> Fp8Linear:
        """An Fp8Linear sharing `linear`'s weight and bias Parameters (no copy)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"Fp8Linear.from_linear: expected an nn.Linear, got {type(linear).__name__}"
            )
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.register_parameter("bias", linear.bias)
        new.recipe = as_recipe(recipe)
        new.weight_quantizations = 0
        new._wcache = None
        new.label = None
        new.train(linear.training)
        return new

    def extra_repr(self) -> str:
        rec = self.recipe.name if self.recipe is not None else "high precision"
        return f"{super().extra_repr()}, recipe={rec}"

    def invalidate_weight_cache(self) -> None:
        self._wcache = None

    def _apply(self, fn, *args, **kwargs):
        self._wcache = None  # .to()/.cuda() move the weight: the old cache is dead memory
        return super()._apply(fn, *args, **kwargs)

    def quantized_weight(self, recipe: Fp8Recipe | None = None) -> Operand:
        """The weight quantized along K for the forward GEMM, from the cache when valid."""
        r = recipe or self.recipe
        w = self.weight
        key = (w._version, w.data_ptr(), w.device, w.dtype, tuple(w.shape), r)
        if self._wcache is not None and self._wcache[0] == key:
            wq = self._wcache[1]
            # A cache filled under inference_mode cannot be saved for a backward outside it.
            if torch.is_inference_mode_enabled() or not wq.data.is_inference():
                return wq
        with torch.no_grad():
            wq = quantize_operand(
                w, r, fmt=r.fwd_fmt, weight=True, name=_what(getattr(self, "label", None), "weight")
            )
        self._wcache = (key, wq)
        self.weight_quantizations += 1
        return wq

    @staticmethod
    def quantized_input(x, x2, r: Fp8Recipe, label) -> Operand:
        """x2 (x's 2-D view) quantized along K, shared with the layers reading the same x."""
        name = _what(label, "input")
        key = (
            r.granularity,
            r.fwd_fmt,
            r.act_block,
            r.pow2_scales,
            r.check_finite,
            r.block_format,
            r.scale_rounding,
        )
        return memo_quantize(
            x, key, name, lambda: quantize_operand(x2, r, fmt=r.fwd_fmt, weight=False, name=name)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.recipe
        if r is None or x.numel() == 0:
            return F.linear(x, self.weight, self.bias)
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Fp8Linear: input has {x.shape[-1]} features in its last dim, "
                f"expected {self.in_features}"
            )
        dtype = x.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        x2 = x.reshape(-1, self.in_features)
        wq = self.quantized_weight(r)
        label = getattr(self, "label", None)
        with torch.no_grad():
            xq = self.quantized_input(x, x2, r, label)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            fn = _HpBackwardFn if r.hp_backward else _Fp8LinearFn
            y = fn.apply(x2, self.weight, r, wq, dtype, label, xq)
        else:
            y = scaled_matmul(xq, wq, dtype, use_fast_accum=r.use_fast_accum)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.reshape(*x.shape[:-1], self.out_features)
