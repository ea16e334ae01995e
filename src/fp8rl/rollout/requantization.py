"""The rollout's side of the FP8 layer: which recipe, and re-quantizing changed weights."""

from __future__ import annotations

import torch

from ..fp8 import Fp8Recipe, fp8_linears, use_recipe

__all__ = ["quantization_count", "requantize", "use_recipe"]


def quantization_count(model: torch.nn.Module) -> int:
    """Total weight quantizations done so far by the model's Fp8Linear layers."""
    return sum(int(m.weight_quantizations) for m in fp8_linears(model))


def requantize(model: torch.nn.Module, recipe: Fp8Recipe, *, force: bool = False) -> int:
    """Refill every stale quantized-weight cache under `recipe`; returns how many were refilled.

    `force` also drops the valid ones: needed after writes through `weight.data`, which
    the version counter the caches are keyed on does not see.
    """
    before = quantization_count(model)
    with torch.no_grad(), use_recipe(model, recipe):
        for layer in fp8_linears(model):
            if force:
                layer.invalidate_weight_cache()
            if layer.recipe is not None:
                layer.quantized_weight()
    return quantization_count(model) - before
