"""`fake_quantize`: the values a recipe's forward GEMM sees in place of a tensor."""

from __future__ import annotations

import torch

from .linear import quantize_operand
from .recipe import as_recipe


def fake_quantize(x: torch.Tensor, recipe, *, weight: bool = False, **options) -> torch.Tensor:
    """The dequantized values of the recipe's forward cast of x along its last dim (the
    reduction dim of x @ W.T), in x's shape and dtype.

    recipe: an Fp8Recipe or a recipe name ('tensorwise', 'rowwise', 'blockwise', 'mxfp8',
        'mxfp4', 'nvfp4'); options override its fields (e.g. scale_rounding="rceil").
    weight: cast x as the forward's weight operand (only blockwise differs: 128x128 blocks).
    Leading dims are flattened into rows; the tensorwise and NVFP4 tensor scales span all
    of them. inf/nan raise FloatingPointError (recorded inside record_nonfinite()).
    """
    r = as_recipe(recipe)
    if r is None:
        raise ValueError("fake_quantize: recipe=None is high precision: there is no cast to apply")
    if options:
        r = r.replace(**options)
    if not isinstance(weight, bool):
        raise ValueError(f"fake_quantize: weight={weight!r} must be a bool")
    what = "fake_quantize " + ("weight" if weight else "input")
    q = quantize_operand(x, r, fmt=r.fwd_fmt, weight=weight, name=what)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    return q.dequantize(work).to(x.dtype)
