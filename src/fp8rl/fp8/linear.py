"""`Fp8Linear`: an nn.Linear whose three GEMMs run in FP8 when it has a recipe."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .input_memo import memo_quantize
from .matmul import scaled_matmul
from .quantize import quantize
from .recipe import Fp8Recipe, as_recipe
from .tensor import Fp8Tensor


def quantize_operand(
    x2: torch.Tensor, recipe: Fp8Recipe, *, fmt: str, weight: bool, name: str
) -> Fp8Tensor:
    """Quantize a GEMM operand laid out (rows, contraction) as the recipe says.

    Off CUDA the GEMM is emulated on the dequantized values: they are computed here, once,
    and travel with the operand (into its transpose and the backward) instead of being
    recomputed by every GEMM that reads it.
    """
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
    Otherwise the scales are recomputed along the new contraction dim.
    """
    return recipe.granularity == "tensorwise" or (
        recipe.granularity == "blockwise" and block[0] == block[1]
    )


class _Fp8LinearFn(torch.autograd.Function):
    """y = q(x) q(W)^T;  dx = q(dy) q(W);  dW = q(dy)^T q(x), each q along its GEMM's K."""

    @staticmethod
    def forward(ctx, x2, weight, recipe: Fp8Recipe, wq: Fp8Tensor, out_dtype, label, xq):
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
        # FP8 operands go through save_for_backward (saved-tensor hooks see them); meta rebuilds
        # them.
        ctx.save_for_backward(
            weight if need_dx and not wt_ready else None,
            xt.data if xt is not None else None,
            xt.scale if xt is not None else None,
            wq.data if wt_ready else None,
            wq.scale if wt_ready else None,
            xt.dequantized if xt is not None else None,
        )
        # the weight's cached transpose (emulation only): one per weight version, not per call
        ctx.wq = wq if wt_ready and wq.dequantized is not None else None
        ctx.meta = (
            None if xt is None else (xt.granularity, xt.block, xt.fmt),
            None if not wt_ready else (wq.granularity, wq.block, wq.fmt),
        )
        return y

    @staticmethod
    def backward(ctx, dy):
        r: Fp8Recipe = ctx.recipe
        weight, xt_data, xt_scale, wq_data, wq_scale, xt_deq = ctx.saved_tensors
        xt_meta, wq_meta = ctx.meta
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = None
        dyq = None
        if need_dx:
            dyq = quantize_operand(
                dy, r, fmt=r.grad_fmt, weight=False, name=_what(ctx.label, "grad_output")
            )
            if ctx.wq is not None:
                wt = ctx.wq.t_cached()
            elif wq_meta is not None:
                wt = Fp8Tensor(wq_data, wq_scale, *wq_meta).t()
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
            xt = Fp8Tensor(xt_data, xt_scale, *xt_meta, dequantized=xt_deq)
            dw = scaled_matmul(dyt, xt, ctx.w_dtype)
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

    def quantized_weight(self, recipe: Fp8Recipe | None = None) -> Fp8Tensor:
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
    def quantized_input(x, x2, r: Fp8Recipe, label) -> Fp8Tensor:
        """x2 (x's 2-D view) quantized along K, shared with the layers reading the same x."""
        name = _what(label, "input")
        key = (r.granularity, r.fwd_fmt, r.act_block, r.pow2_scales, r.check_finite)
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
            y = _Fp8LinearFn.apply(x2, self.weight, r, wq, dtype, label, xq)
        else:
            y = scaled_matmul(xq, wq, dtype, use_fast_accum=r.use_fast_accum)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.reshape(*x.shape[:-1], self.out_features)
