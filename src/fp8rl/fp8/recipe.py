"""`Fp8Recipe`: how a linear layer quantizes its three GEMMs (FP8, MXFP8, MXFP4 or NVFP4)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .formats import FORMATS, GRANULARITIES, check_block
from .mx_formats import MX_FORMATS, SCALE_ROUNDINGS

# The block-scaled granularities: "mx" (MXFP8 with e4m3, MXFP4 with e2m1), "nvfp4".
BLOCK_SCALED = ("mx", "nvfp4")
RECIPE_GRANULARITIES = (*GRANULARITIES, *BLOCK_SCALED)
FWD_FORMATS = (*FORMATS, "e2m1")


@dataclass(frozen=True)
class Fp8Recipe:
    """One FP8 training/rollout recipe.

    Each operand is quantized along the contraction dim of the GEMM it enters; blocks are
    (non-contraction rows, contraction cols) of that operand, so a 1x128 activation block
    runs along K in the forward and along the tokens in the weight-gradient GEMM.

    Block-scaled granularities: "mx" with fwd_fmt "e4m3" (MXFP8, all three GEMMs) or
    "e2m1" (MXFP4), one power-of-two scale per 32 elements, `scale_rounding` "floor" or
    "rceil"; "nvfp4" (fwd_fmt "e2m1", an E4M3 scale per 16 and one per tensor).
    hp_backward: both backward GEMMs in high precision on the dequantized forward operands
    (straight-through); required for 4-bit forwards.
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
    scale_rounding: str = "floor"  # mx only: "floor" (OCP) or "rceil" (NVIDIA)
    hp_backward: bool = False  # dx and dW in high precision on the dequantized forward operands

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Fp8Recipe: name={self.name!r} must be a non-empty string")
        if self.granularity not in RECIPE_GRANULARITIES:
            raise ValueError(
                f"Fp8Recipe: granularity={self.granularity!r} is invalid: "
                f"expected one of {list(RECIPE_GRANULARITIES)}"
            )
        for f, allowed in (("fwd_fmt", FWD_FORMATS), ("grad_fmt", FORMATS)):
            if getattr(self, f) not in allowed:
                raise ValueError(
                    f"Fp8Recipe: {f}={getattr(self, f)!r} is invalid: "
                    f"expected one of {sorted(allowed)}"
                )
        if self.fwd_fmt == "e5m2" and self.grad_fmt == "e5m2":
            raise ValueError(
                "Fp8Recipe: fwd_fmt and grad_fmt are both 'e5m2'; the grad-input GEMM "
                "e5m2 x e5m2 has no _scaled_mm kernel"
            )
        for f in ("pow2_scales", "use_fast_accum", "check_finite", "hp_backward"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"Fp8Recipe: {f}={getattr(self, f)!r} must be a bool")
        self._check_block_scaled()
        # tuple() keeps the recipe hashable when blocks come in as lists (e.g. from YAML).
        object.__setattr__(self, "act_block", check_block(self.act_block, "Fp8Recipe.act_block"))
        object.__setattr__(
            self, "weight_block", check_block(self.weight_block, "Fp8Recipe.weight_block")
        )

    def _check_block_scaled(self) -> None:
        g, what = self.granularity, f"Fp8Recipe {self.name!r}"
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(
                f"{what}: scale_rounding={self.scale_rounding!r} is invalid: "
                f"expected one of {list(SCALE_ROUNDINGS)}"
            )
        if self.scale_rounding != "floor" and g != "mx":
            raise ValueError(f"{what}: scale_rounding applies to granularity 'mx' only, not {g!r}")
        allowed = {"mx": ("e4m3", "e2m1"), "nvfp4": ("e2m1",)}.get(g, tuple(FORMATS))
        if self.fwd_fmt not in allowed:
            raise ValueError(
                f"{what}: fwd_fmt={self.fwd_fmt!r} does not fit granularity {g!r}: "
                f"expected one of {list(allowed)}"
            )
        if g in BLOCK_SCALED:
            if self.grad_fmt != "e4m3":
                raise ValueError(f"{what}: grad_fmt={self.grad_fmt!r}: {g} gradients are e4m3")
            for f in ("pow2_scales", "use_fast_accum"):
                if getattr(self, f):
                    raise ValueError(f"{what}: {f}=True applies to the FP8 granularities, not {g}")
        if self.fwd_fmt == "e2m1" and not self.hp_backward:
            raise ValueError(
                f"{what}: hp_backward=False with 4-bit (e2m1) operands is not supported: "
                "4-bit backward GEMMs need stochastic rounding, which fp8rl does not do"
            )

    @property
    def block_format(self) -> str | None:
        """'mxfp8', 'mxfp4' or 'nvfp4' for the block-scaled granularities, else None."""
        if self.granularity == "nvfp4":
            return "nvfp4"
        if self.granularity == "mx":
            return "mxfp8" if self.fwd_fmt == "e4m3" else "mxfp4"
        return None

    @property
    def block_size(self) -> int | None:
        """Elements per scale along the reduction dim (32 MX, 16 NVFP4; None for FP8)."""
        fmt = self.block_format
        return MX_FORMATS[fmt][1] if fmt else None

    @property
    def alignment(self) -> int:
        """Both dims of a converted layer must be multiples of this: 16 for the FP8
        granularities (the FP8 GEMM kernels' operand alignment), 32 for the block-scaled
        recipes, whose GPU kernels pack K. Blockwise needs no multiple of its blocks: a
        partial edge block is scaled by its own amax, and the GPU path zero-pads to whole
        blocks (matmul.py)."""
        return 32 if self.granularity in BLOCK_SCALED else 16

    def gemm_precisions(self) -> dict[str, str]:
        """What each GEMM of a converted layer computes in, for reports and docs."""
        if self.block_format:
            fwd = self.block_format + (
                "" if self.granularity == "nvfp4" else f" {self.scale_rounding}"
            )
        else:
            fwd = f"{self.granularity} {self.fwd_fmt}"
        if self.hp_backward:
            bwd = "high precision (float32) on the dequantized forward operands"
            return {"forward": fwd, "grad_input": bwd, "grad_weight": bwd}
        if self.block_format:
            return {"forward": fwd, "grad_input": fwd, "grad_weight": fwd}
        grad = f"{self.granularity} {self.grad_fmt} x {self.fwd_fmt}"
        return {"forward": f"{fwd} x {self.fwd_fmt}", "grad_input": grad, "grad_weight": grad}

    @classmethod
    def from_name(cls, name: str, **overrides) -> Fp8Recipe:
        """The paper's recipes: 'tensorwise' (e4m3 fwd, e5m2 output grads), 'rowwise' and
        'blockwise' (e4m3 everywhere; blockwise 1x128 activations, 128x128 weights); the
        block-scaled 'mxfp8' (all three GEMMs), 'mxfp4' and 'nvfp4' (4-bit forward,
        high-precision backward)."""
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
    "mxfp8": Fp8Recipe("mxfp8", "mx", fwd_fmt="e4m3", grad_fmt="e4m3"),
    "mxfp4": Fp8Recipe("mxfp4", "mx", fwd_fmt="e2m1", hp_backward=True),
    "nvfp4": Fp8Recipe("nvfp4", "nvfp4", fwd_fmt="e2m1", hp_backward=True),
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
