"""Swapping nn.Linear for Fp8Linear in a model, and switching recipes for a phase."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch.nn as nn

from .keep import LM_HEAD, KeepHighPrecision, gemm_macs
from .linear import Fp8Linear
from .recipe import Fp8Recipe, as_recipe

# Layer names the default policy keeps in high precision (as in the paper's stack);
# KeepHighPrecision(lm_head=False) quantizes them too.
ALWAYS_SKIPPED = (LM_HEAD,)


@dataclass
class ConversionReport:
    recipe: Fp8Recipe | None
    converted: list[str] = field(default_factory=list)  # newly swapped nn.Linear
    updated: list[str] = field(default_factory=list)  # Fp8Linear already there, recipe set
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    keep: KeepHighPrecision = field(default_factory=KeepHighPrecision)
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # every linear: (in, out)

    @property
    def coverage(self) -> float:
        """The fraction of the linear layers' GEMM FLOPs per token left in FP8."""
        macs = {n: gemm_macs(*d) for n, d in self.dims.items()}
        total = sum(macs.values())
        if self.recipe is None or not total:
            return 0.0
        return sum(macs[n] for n in (*self.converted, *self.updated)) / total

    @property
    def gemms(self) -> dict[str, str]:
        """What a converted layer's forward, grad-input and grad-weight GEMMs compute in."""
        return self.recipe.gemm_precisions() if self.recipe is not None else {}

    def __str__(self) -> str:
        rec = self.recipe.name if self.recipe is not None else "high precision"
        lines = [
            f"FP8 conversion ({rec}): {len(self.converted)} converted, "
            f"{len(self.updated)} updated, {len(self.skipped)} kept in high precision",
            f"  FP8 coverage: {100 * self.coverage:.2f} % of the linear layers' GEMM FLOPs "
            "per token (sum of in x out)",
        ]
        g = self.gemms
        if g:
            lines.append(
                f"  GEMMs of a converted layer: forward {g['forward']}; "
                f"grad input {g['grad_input']}; grad weight {g['grad_weight']}"
            )
        lines += [f"  converted  {n} ({self._dims(n)})" for n in self.converted]
        lines += [f"  updated    {n} ({self._dims(n)})" for n in self.updated]
        lines += [f"  kept       {n} ({self._dims(n)}): {why}" for n, why in self.skipped.items()]
        return "\n".join(lines)

    def _dims(self, name: str) -> str:
        d = self.dims.get(name)
        return f"{d[0]} -> {d[1]}" if d else "?"


def _skip_reason(
    name: str, lin: nn.Linear, recipe: Fp8Recipe | None, module_filter, kept: dict[str, str]
) -> str | None:
    if name in kept:
        return kept[name]
    if module_filter is not None and not module_filter(name, lin):
        return "excluded by module_filter"
    if recipe is not None:
        a = recipe.alignment
        if lin.in_features % a or lin.out_features % a:
            return (
                f"dims (in={lin.in_features}, out={lin.out_features}) are not multiples of "
                f"{a} ({recipe.granularity} alignment)"
            )
    return None


def convert_to_fp8(
    model: nn.Module,
    recipe,
    module_filter: Callable[[str, nn.Module], bool] | None = None,
    keep: KeepHighPrecision | None = None,
) -> ConversionReport:
    """Swap every eligible nn.Linear of `model` for an Fp8Linear sharing its parameters.

    Skipped (and reported): the layers `keep` keeps (default: lm_head), layers
    module_filter(name, module) rejects, layers
    whose in/out dims are not multiples of recipe.alignment, and nn.Linear subclasses
    other than Fp8Linear. Layers that already are Fp8Linear just get the new recipe
    (or None, with the reason, if they fail the checks).
    """
    recipe = as_recipe(recipe)
    keep = KeepHighPrecision() if keep is None else keep
    report = ConversionReport(recipe, keep=keep)
    kept = keep.reasons(model)
    swaps: dict[int, Fp8Linear] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or not name:
            continue
        report.dims[name] = (mod.in_features, mod.out_features)
        why = _skip_reason(name, mod, recipe, module_filter, kept)
        if isinstance(mod, Fp8Linear):
            mod.recipe = None if why else recipe
            mod.label = mod.label or name
            if why:
                report.skipped[name] = why
            else:
                report.updated.append(name)
        elif why:
            report.skipped[name] = why
        elif type(mod) is not nn.Linear:
            report.skipped[name] = (
                f"{type(mod).__name__} is an nn.Linear subclass fp8rl does not convert"
            )
        else:
            swaps[id(mod)] = Fp8Linear.from_linear(mod, recipe)
            swaps[id(mod)].label = name  # FP8 errors and non-finite records name the layer
            report.converted.append(name)
    if isinstance(model, nn.Linear) and not isinstance(model, Fp8Linear):
        raise ValueError("convert_to_fp8: model is itself an nn.Linear; use Fp8Linear.from_linear")
    # A module registered under two names is swapped under both, so it stays shared.
    for parent in model.modules():
        for child_name, child in list(parent._modules.items()):  # named_children() dedups
            if id(child) in swaps:
                setattr(parent, child_name, swaps[id(child)])
    return report


def named_fp8_linears(model: nn.Module) -> Iterator[tuple[str, Fp8Linear]]:
    for name, mod in model.named_modules():
        if isinstance(mod, Fp8Linear):
            yield name, mod


def fp8_linears(model: nn.Module) -> list[Fp8Linear]:
    """Every Fp8Linear of the model (the model itself included if it is one)."""
    return [mod for _, mod in named_fp8_linears(model)]


@contextlib.contextmanager
def use_recipe(model: nn.Module, recipe):
    """Set `recipe` (an Fp8Recipe, a recipe name, or None) on every Fp8Linear for the
    duration of the block; the previous recipes come back on exit, exceptions included."""
    recipe = as_recipe(recipe)
    layers = fp8_linears(model)
    previous = [m.recipe for m in layers]
    try:
        for m in layers:
            m.recipe = recipe
        yield model
    finally:
        for m, r in zip(layers, previous, strict=True):
            m.recipe = r


def high_precision(model: nn.Module):
    """Every Fp8Linear computes exactly as nn.Linear with the same weights (no copy)."""
    return use_recipe(model, None)
