"""Precision names of the config -> FP8 recipes (None: the master dtype, no quantization)."""

from __future__ import annotations

import dataclasses

import torch

from ..fp8 import Fp8Recipe, convert_to_fp8
from ..fp8.recipe import RECIPES

# the master dtype's names, then one FP8 precision per named recipe
PRECISIONS = ("bf16", "fp32", *(f"fp8-{name}" for name in RECIPES))


def recipe_for(precision: str, check_finite: bool = True) -> Fp8Recipe | None:
    if precision.startswith("fp8-"):
        return dataclasses.replace(
            Fp8Recipe.from_name(precision[len("fp8-") :]), check_finite=check_finite
        )
    return None


def prepare_model(model: torch.nn.Module, rollout_precision: str, train_precision: str):
    """Swap linears for Fp8Linear when either phase runs FP8; returns the conversion report.

    Blockwise needs 128-aligned dims, so when any phase is blockwise the conversion is
    checked against it: a layer then runs the same precision in every phase.
    """
    recipes = [
        r for r in (recipe_for(rollout_precision), recipe_for(train_precision)) if r is not None
    ]
    if not recipes:
        return None
    strictest = next((r for r in recipes if r.granularity == "blockwise"), recipes[0])
    return convert_to_fp8(model, strictest)
