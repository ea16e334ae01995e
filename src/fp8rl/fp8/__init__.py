"""FP8 and microscaled (MXFP8, MXFP4, NVFP4) numerics: formats, scaling, scaled matmul,
Fp8Linear, model conversion, fake quantization.

See docs/fp8.md. Everything runs on the CPU (GEMMs emulated exactly); on CUDA with compute
capability >= 8.9 the FP8 GEMMs run through torch._scaled_mm, and the block-scaled ones on
SM100 through torch.nn.functional.scaled_mm (emulated, with a warning, elsewhere).
"""

from .convert import (
    ConversionReport,
    convert_to_fp8,
    fp8_linears,
    high_precision,
    named_fp8_linears,
    use_recipe,
)
from .fake_quantize import fake_quantize
from .formats import FORMATS, GRANULARITIES, fmt_max, fp8_dtype, saturating_cast
from .keep import KeepHighPrecision
from .kernels import scale_from_amax
from .linear import Fp8Linear
from .matmul import emulated_scaled_matmul, scaled_matmul
from .mx_formats import MX_FORMATS
from .mx_quantize import quantize_mx
from .mx_tensor import BlockScaledTensor
from .quantize import quantize, record_nonfinite
from .recipe import RECIPES, Fp8Recipe, as_recipe
from .tensor import Fp8Tensor

__all__ = [
    "FORMATS",
    "GRANULARITIES",
    "MX_FORMATS",
    "RECIPES",
    "BlockScaledTensor",
    "ConversionReport",
    "Fp8Linear",
    "Fp8Recipe",
    "Fp8Tensor",
    "KeepHighPrecision",
    "as_recipe",
    "convert_to_fp8",
    "emulated_scaled_matmul",
    "fake_quantize",
    "fmt_max",
    "fp8_dtype",
    "fp8_linears",
    "high_precision",
    "named_fp8_linears",
    "quantize",
    "quantize_mx",
    "record_nonfinite",
    "saturating_cast",
    "scale_from_amax",
    "scaled_matmul",
    "use_recipe",
]
