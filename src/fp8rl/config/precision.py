"""Precision names of the config -> quantization recipes (None: the master dtype, none)."""

from __future__ import annotations

import dataclasses

import torch

from ..fp8 import Fp8Recipe, KeepHighPrecision, convert_to_fp8
from ..fp8.recipe import RECIPES

HIGH_PRECISIONS = ("bf16", "fp32")
# the FP8 recipes under an "fp8-" prefix; the block-scaled ones under their own names
RECIPE_OF_PRECISION = {
    (name if RECIPES[name].block_format else f"fp8-{name}"): name for name in RECIPES
}
# the master dtype's names, then one precision per named recipe
PRECISIONS = (*HIGH_PRECISIONS, *RECIPE_OF_PRECISION)


def is_quantized(precision: str) -> bool:
    """Does this precision quantize the linear layers (FP8, MXFP8, MXFP4, NVFP4)?"""
    return precision in RECIPE_OF_PRECISION


def recipe_for(precision: str, check_finite: bool = True) -> Fp8Recipe | None:
    if is_quantized(precision):
        return dataclasses.replace(
            Fp8Recipe.from_name(RECIPE_OF_PRECISION[precision]), check_finite=check_finite
        )
    return None


def conversion_recipe(rollout_precision: str, train_precision: str) -> Fp8Recipe | None:
    """The recipe the model is converted against: of the phases' recipes, the one with the
    largest alignment (block-scaled: 32), so a layer runs the same precision in every phase."""
    recipes = [
        r for r in (recipe_for(rollout_precision), recipe_for(train_precision)) if r is not None
    ]
    return max(recipes, key=lambda r: r.alignment) if recipes else None


def prepare_model(
    model: torch.nn.Module,
    rollout_precision: str,
    train_precision: str,
    keep: KeepHighPrecision | None = None,
):
    """Swap linears for Fp8Linear when either phase quantizes, but those `keep` keeps in high
    precision (None: lm_head); returns the conversion report. The one conversion of a run:
    rollout and training share the model, so they agree on every layer."""
    recipe = conversion_recipe(rollout_precision, train_precision)
    return None if recipe is None else convert_to_fp8(model, recipe, keep=keep)
