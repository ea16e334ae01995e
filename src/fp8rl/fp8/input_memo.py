"""One quantized input for the linears that read the same tensor (q, k and v; gate and up).

In a Qwen3 layer 7 linears read 4 distinct inputs, so the CPU emulation quantized (and
dequantized) each of those inputs up to 3 times. Quantizing is deterministic: the memo hands
the later layers the first one's result. CPU only: on CUDA the quantizer is compiled and the
memo's Python-level checks would only get in the way of graphs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .matmul import Operand
from .quantize import flag_nonfinite, nonfinite_count


@dataclass
class _Entry:
    source: weakref.ref  # the layer input (a weak reference: the memo keeps nothing alive)
    version: int
    key: tuple
    inference: bool
    quantized: Operand
    nonfinite: bool  # its quantization recorded a non-finite input


_last: list[_Entry | None] = [None]


def memo_quantize(x: torch.Tensor, key: tuple, name: str, make: Callable[[], Operand]):
    """`make()` (the quantization of x's 2-D view), or the memo's when x, unchanged, was
    quantized the same way (`key`) just before. A memoized non-finite input is recorded
    again under this layer's `name`, as a fresh quantization would."""
    if x.is_cuda:
        return make()
    e = _last[0]
    inference = torch.is_inference_mode_enabled()
    if (
        e is not None
        and e.source() is x
        and e.version == x._version
        and e.key == key
        and e.inference == inference
    ):
        if e.nonfinite:
            flag_nonfinite(
                "quantize", name, e.quantized.data.shape, "no FP8 scale can represent it"
            )
        return e.quantized
    before = nonfinite_count()
    q = make()
    _last[0] = _Entry(weakref.ref(x), x._version, key, inference, q, nonfinite_count() > before)
    return q


def forget() -> None:
    _last[0] = None
