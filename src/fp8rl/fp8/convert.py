"""Swapping nn.Linear for Fp8Linear (and fused MoE experts for Fp8Experts) in a model, and
switching recipes for a phase."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch.nn as nn

from .experts import FUSED_EXPERTS, PROJECTIONS, Fp8Experts, is_fused_experts
from .keep import LM_HEAD, KeepHighPrecision, decoder_blocks, gemm_macs
from .linear import Fp8Linear
from .recipe import Fp8Recipe, as_recipe

# Layer names the default policy keeps in high precision (as in the paper's stack);
# KeepHighPrecision(lm_head=False) quantizes them too.
ALWAYS_SKIPPED = (LM_HEAD,)
# A MoE router (an nn.Linear named gate in older transformers): its top-k is a discrete choice
# an FP8 error in its logits flips, and its GEMM (one output per expert) is too small to gain.
ROUTER_NAMES = ("gate", "router")
FP8_LAYERS = (Fp8Linear, Fp8Experts)


@dataclass
class ConversionReport:
    recipe: Fp8Recipe | None
    converted: list[str] = field(default_factory=list)  # newly swapped nn.Linear
    updated: list[str] = field(default_factory=list)  # Fp8Linear already there, recipe set
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    keep: KeepHighPrecision = field(default_factory=KeepHighPrecision)
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # every linear: (in, out)
    # a fused expert weight (experts.gate_up_proj / .down_proj) -> how many experts it holds:
    # each of their GEMMs runs under the recipe
    experts: dict[str, int] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        """The fraction of the linear layers' GEMM FLOPs per token left in FP8 (every expert
        counted, not only those a token is routed to)."""
        macs = {n: gemm_macs(*d) * self.experts.get(n, 1) for n, d in self.dims.items()}
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
        lines += [f"  converted  {n} ({self._dims(n)}){self._count(n)}" for n in self.converted]
        lines += [f"  updated    {n} ({self._dims(n)})" for n in self.updated]
        lines += [f"  kept       {n} ({self._dims(n)}): {why}" for n, why in self.skipped.items()]
        return "\n".join(lines)

    def _dims(self, name: str) -> str:
        d = self.dims.get(name)
        return f"{d[0]} -> {d[1]}" if d else "?"

    def _count(self, name: str) -> str:
        return f" x {self.experts[name]} experts" if name in self.experts else ""


def _skip_reason(
    name: str, mod: nn.Module, recipe: Fp8Recipe | None, module_filter, kept: dict[str, str]
) -> str | None:
    if name in kept:
        return kept[name]
    if name.rsplit(".", 1)[-1] in ROUTER_NAMES:
        return "a MoE router stays high precision"
    if module_filter is not None and not module_filter(name, mod):
        return "excluded by module_filter"
    if recipe is not None:
        a = recipe.alignment
        dims = _dims(mod)
        if any(d % a for d in dims.values()):
            text = ", ".join(f"{k}={v}" for k, v in dims.items())
            return f"dims ({text}) are not multiples of {a} ({recipe.granularity} alignment)"
    return None


def _dims(mod: nn.Module) -> dict[str, int]:
    """The GEMM dims a recipe's alignment applies to."""
    if isinstance(mod, nn.Linear):
        return {"in": mod.in_features, "out": mod.out_features}
    return {"hidden": int(mod.gate_up_proj.shape[2]), "intermediate": int(mod.down_proj.shape[2])}


def _is_router_module(name: str, mod: nn.Module) -> bool:
    """transformers 5.x's routers: a module of their own holding the (E, H) weight."""
    weight = getattr(mod, "weight", None)
    return (
        name.rsplit(".", 1)[-1] in ROUTER_NAMES
        and not isinstance(mod, nn.Linear)
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 2
    )


def _expert_kept(name: str, keep: KeepHighPrecision, blocks) -> dict[str, str]:
    """keep_high_precision for a fused-experts module: its block and its name patterns (the
    module is converted whole, so down_proj alone cannot be kept)."""
    why = keep.why(name, blocks)
    return {name: "; ".join(why)} if why else {}


def _convert_experts(name, mod, recipe, module_filter, report, swaps, kept) -> None:
    """Fused MoE experts: swapped for (or updated as) Fp8Experts, each fused weight reported."""
    why = _skip_reason(name, mod, recipe, module_filter, kept)
    if why is None and not isinstance(mod, Fp8Experts) and type(mod).__name__ not in FUSED_EXPERTS:
        why = f"{type(mod).__name__} is a fused-experts class fp8rl does not convert"
    names = [f"{name}.{p}" for p in PROJECTIONS]
    n_experts, hidden = int(mod.gate_up_proj.shape[0]), int(mod.gate_up_proj.shape[2])
    inter = int(mod.down_proj.shape[2])
    report.dims.update(zip(names, ((hidden, 2 * inter), (inter, hidden)), strict=True))
    report.experts.update(dict.fromkeys(names, n_experts))
    if why:
        report.skipped.update(dict.fromkeys(names, why))
        if isinstance(mod, Fp8Experts):
            mod.recipe = None
        return
    if isinstance(mod, Fp8Experts):
        mod.recipe = recipe
        report.updated += names
    else:
        swaps[id(mod)] = Fp8Experts(mod, recipe)
        swaps[id(mod)].label = name
        report.converted += names


def convert_to_fp8(
    model: nn.Module,
    recipe,
    module_filter: Callable[[str, nn.Module], bool] | None = None,
    keep: KeepHighPrecision | None = None,
) -> ConversionReport:
    """Swap every eligible nn.Linear of `model` for an Fp8Linear sharing its parameters, and
    every module of fused MoE experts (transformers 5.x) for an Fp8Experts.

    Skipped (and reported): the layers `keep` keeps (default: lm_head), MoE routers, layers
    module_filter(name, module) rejects, layers
    whose in/out dims are not multiples of recipe.alignment, and nn.Linear subclasses
    other than Fp8Linear. Layers that already are Fp8Linear just get the new recipe
    (or None, with the reason, if they fail the checks).
    """
    recipe = as_recipe(recipe)
    keep = KeepHighPrecision() if keep is None else keep
    report = ConversionReport(recipe, keep=keep)
    kept = keep.reasons(model)
    blocks = decoder_blocks(model)
    swaps: dict[int, nn.Module] = {}
    for name, mod in model.named_modules():
        if name and is_fused_experts(mod):
            expert_kept = _expert_kept(name, keep, blocks)
            _convert_experts(name, mod, recipe, module_filter, report, swaps, expert_kept)
            continue
        if _is_router_module(name, mod):
            report.skipped[name] = "a MoE router stays high precision"
            continue
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


def named_fp8_linears(model: nn.Module) -> Iterator[tuple[str, Fp8Linear | Fp8Experts]]:
    """Every FP8 layer: Fp8Linear and Fp8Experts (recipe, weight cache and counters alike)."""
    for name, mod in model.named_modules():
        if isinstance(mod, FP8_LAYERS):
            yield name, mod


def fp8_linears(model: nn.Module) -> list[Fp8Linear | Fp8Experts]:
    """Every FP8 layer of the model (the model itself included if it is one)."""
    return [mod for _, mod in named_fp8_linears(model)]


@contextlib.contextmanager
def use_recipe(model: nn.Module, recipe):
    """Set `recipe` (an Fp8Recipe, a recipe name, or None) on every FP8 layer for the
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
    """Every FP8 layer computes exactly as its high-precision original (no copy)."""
    return use_recipe(model, None)
