"""`Fp8Recipe`: how a linear layer quantizes its three GEMMs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .formats import FORMATS, GRANULARITIES, check_block


@dataclass(frozen=True)
class Fp8Recipe:
    """One FP8 training/rollout recipe.

    Each operand is quantized along the contraction dim of the GEMM it enters; blocks are
    (non-contraction rows, contraction cols) of that operand, so a 1x128 activation block
    runs along K in the forward and along the tokens in the weight-gradient GEMM.
    """

    name: str
    granularity: str
    fwd_fmt: str = "e4m3"  # inputs and weights
    grad_fmt: str = "e4m3"  # output gradients (dy)
    pow2_scales: bool = False
    act_block: tuple[int, int] = (1, 128)  # inputs and output gradients (blockwise)
    weight_block: tuple[int, int] = (128, 128)  # weights (blockwise)
    use_fast_accum: bool = False  # Hopper fast accumulation in the forward GEMM (CUDA only)
    check_finite: bool = True  # raise FloatingPointError on inf/nan (a device sync on CUDA)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Fp8Recipe: name={self.name!r} must be a non-empty string")
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"Fp8Recipe: granularity={self.granularity!r} is invalid: "
                f"expected one of {list(GRANULARITIES)}"
            )
        for f in ("fwd_fmt", "grad_fmt"):
            if getattr(self, f) not in FORMATS:
                raise ValueError(
                    f"Fp8Recipe: {f}={getattr(self, f)!r} is invalid: "
                    f"expected one of {sorted(FORMATS)}"
                )
        if self.fwd_fmt == "e5m2" and self.grad_fmt == "e5m2":
            raise ValueError(
                "Fp8Recipe: fwd_fmt and grad_fmt are both 'e5m2'; the grad-input GEMM "
                "e5m2 x e5m2 has no _scaled_mm kernel"
            )
        for f in ("pow2_scales", "use_fast_accum", "check_finite"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"Fp8Recipe: {f}={getattr(self, f)!r} must be a bool")
        # tuple() keeps the recipe hashable when blocks come in as lists (e.g. from YAML).
        object.__setattr__(self, "act_block", check_block(self.act_block, "Fp8Recipe.act_block"))
        object.__setattr__(
            self, "weight_block", check_block(self.weight_block, "Fp8Recipe.weight_block")
        )

    @property
    def alignment(self) -> int:
        """Both dims of a converted layer must be multiples of this (16; 128 blockwise)."""
        if self.granularity != "blockwise":
            return 16
        return math.lcm(16, self.act_block[1], *self.weight_block)

    @classmethod
    def from_name(cls, name: str, **overrides) -> Fp8Recipe:
        """The paper's recipes: 'tensorwise' (e4m3 fwd, e5m2 output grads), 'rowwise' and
        'blockwise' (e4m3 everywhere; blockwise 1x128 activations, 128x128 weights)."""
        if name not in RECIPES:
            raise ValueError(
                f"Fp8Recipe: unknown recipe name {name!r}: expected one of {sorted(RECIPES)}"
            )
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"Fp8Recipe: unknown field(s) {unknown}: valid fields are {fields}")
        return dataclasses.replace(RECIPES[name], **overrides)

    def replace(self, **changes) -> Fp8Recipe:
        fields = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"Fp8Recipe: unknown field(s) {unknown}: valid fields are {fields}")
        return dataclasses.replace(self, **changes)


RECIPES: dict[str, Fp8Recipe] = {
    "tensorwise": Fp8Recipe("tensorwise", "tensorwise", fwd_fmt="e4m3", grad_fmt="e5m2"),
    "rowwise": Fp8Recipe("rowwise", "rowwise"),
    "blockwise": Fp8Recipe("blockwise", "blockwise", act_block=(1, 128), weight_block=(128, 128)),
}


def as_recipe(recipe) -> Fp8Recipe | None:
    """Accept an Fp8Recipe, a recipe name, or None (high precision)."""
    if recipe is None or isinstance(recipe, Fp8Recipe):
        return recipe
    if isinstance(recipe, str):
        return Fp8Recipe.from_name(recipe)
    raise TypeError(
        f"recipe={recipe!r} is invalid: expected an Fp8Recipe, None, or one of {sorted(RECIPES)}"
    )
