"""FP8 numerics: formats, scaling, scaled matmul, Fp8Linear, model conversion.

See docs/fp8.md. Everything runs on the CPU (FP8 GEMMs emulated exactly); on CUDA with
compute capability >= 8.9 the GEMMs run through torch._scaled_mm.
"""

from .convert import (
    ConversionReport,
    convert_to_fp8,
    fp8_linears,
    high_precision,
    named_fp8_linears,
    use_recipe,
)
from .formats import FORMATS, GRANULARITIES, fmt_max, fp8_dtype, saturating_cast
from .kernels import scale_from_amax
from .linear import Fp8Linear
from .matmul import emulated_scaled_matmul, scaled_matmul
from .quantize import quantize, record_nonfinite
from .recipe import RECIPES, Fp8Recipe, as_recipe
from .tensor import Fp8Tensor

__all__ = [
    "FORMATS",
    "GRANULARITIES",
    "RECIPES",
    "ConversionReport",
    "Fp8Linear",
    "Fp8Recipe",
    "Fp8Tensor",
    "as_recipe",
    "convert_to_fp8",
    "emulated_scaled_matmul",
    "fmt_max",
    "fp8_dtype",
    "fp8_linears",
    "high_precision",
    "named_fp8_linears",
    "quantize",
    "record_nonfinite",
    "saturating_cast",
    "scale_from_amax",
    "scaled_matmul",
    "use_recipe",
]
