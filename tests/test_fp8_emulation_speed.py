"""The CPU emulation's speed-ups change no bit: the fast e4m3 -> float32 conversion, the
dequantized values kept with an operand, and the input memo that shares one quantized input
among the linears reading the same tensor (issue 22)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.fp8 import Fp8Linear, quantize, record_nonfinite
from fp8rl.fp8 import linear as fp8_linear
from fp8rl.fp8.formats import _TABLE_MAX, fp8_to_float32
from fp8rl.fp8.input_memo import forget

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("copies", [1, _TABLE_MAX // 256 + 1])  # the table path, the integer one
def test_every_code_converts_as_torch_casts_it(dtype, copies):
    codes = torch.arange(256, dtype=torch.uint8).repeat(copies).view(dtype).reshape(copies, 256)
    got = fp8_to_float32(codes)
    assert got.shape == codes.shape and got.dtype == torch.float32
    assert torch.equal(bits(got), bits(codes.to(torch.float32)))  # NaN payloads too


@pytest.mark.parametrize("n", [100, 3 * _TABLE_MAX])
def test_conversion_of_a_transposed_view(n):
    x = torch.randn(n // 50, 50) * torch.logspace(-6, 2, 50)
    q = x.to(torch.float8_e4m3fn).t()
    assert torch.equal(bits(fp8_to_float32(q)), bits(q.to(torch.float32)))


def test_conversion_without_nan_codes_on_the_integer_path():
    x = torch.randn(4 * _TABLE_MAX) * 100
    q = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(bits(fp8_to_float32(q)), bits(q.to(torch.float32)))


@pytest.mark.parametrize(
    "granularity,block", [("tensorwise", (1, 128)), ("blockwise", (32, 32)), ("rowwise", (1, 1))]
)
def test_kept_dequantized_values_are_dequantize_and_follow_the_transpose(granularity, block):
    x = torch.randn(96, 64) * torch.logspace(-3, 3, 64)
    q = quantize(x, granularity, block=block)
    kept = q.with_dequantized()
    assert torch.equal(bits(kept.dequantized), bits(q.dequantize(torch.float32)))
    assert kept.with_dequantized() is kept
    if granularity == "rowwise":
        return  # rowwise has no transpose: its scales run along the other dim
    t = kept.t()
    assert torch.equal(bits(t.dequantized), bits(q.t().dequantize(torch.float32)))
    assert t.dequantized.is_contiguous()  # the layout dequantizing q.t() gives the GEMM
    assert kept.t_cached() is kept.t_cached()


def _layers(recipe: str, n: int = 3) -> list[Fp8Linear]:
    torch.manual_seed(0)
    return [Fp8Linear(64, 48, bias=False, recipe=recipe) for _ in range(n)]


def _count_quantize(monkeypatch) -> list[int]:
    calls = [0]
    real = fp8_linear.quantize

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fp8_linear, "quantize", counted)
    return calls


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_layers_reading_one_input_quantize_it_once_with_the_same_result(recipe, monkeypatch):
    layers = _layers(recipe)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        alone = []
        for layer in layers:
            forget()
            alone.append(layer(x))
        forget()
        for layer in layers:
            layer.quantized_weight()  # weights cached: count the inputs only
        calls = _count_quantize(monkeypatch)
        shared = [layer(x) for layer in layers]
    assert calls[0] == 1
    for a, b in zip(alone, shared, strict=True):
        assert torch.equal(bits(a), bits(b))


def test_the_memo_sees_in_place_changes_and_other_tensors(monkeypatch):
    a, b = _layers("tensorwise", 2)
    x = torch.randn(7, 64)
    with torch.no_grad():
        a(x)
        b.quantized_weight()
        calls = _count_quantize(monkeypatch)
        x.mul_(2.0)  # same tensor, new version
        y = b(x)
        assert calls[0] == 1
        forget()
        assert torch.equal(bits(y), bits(b(x)))
        b(x.clone())  # equal values, another tensor: never a false hit
        assert calls[0] == 3


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_gradients_are_the_same_with_the_memo(recipe):
    def run(share: bool):
        layers = _layers(recipe)
        x = torch.randn(6, 64, requires_grad=True)
        g = torch.Generator().manual_seed(1)
        outs = []
        for layer in layers:
            if not share:
                forget()
            outs.append(layer(x))
        loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)
        loss.backward()
        return [x.grad] + [layer.weight.grad for layer in layers]

    for a, b in zip(run(False), run(True), strict=True):
        assert torch.equal(bits(a), bits(b))


def test_a_memoized_non_finite_input_is_recorded_for_every_layer():
    a, b = _layers("rowwise", 2)
    a.label, b.label = "q_proj", "k_proj"
    x = torch.randn(3, 64)
    x[1, 2] = float("inf")
    with torch.no_grad(), record_nonfinite() as log:
        a(x)
        b(x)
    assert [entry.split(":")[0] for entry in log] == ["q_proj", "k_proj"]
    forget()
    with torch.no_grad(), pytest.raises(FloatingPointError, match="k_proj"):
        b(x)


def test_the_cpu_e4m3_cast_without_clamp_saturates_as_the_clamp_did():
    from fp8rl.fp8 import saturating_cast

    x = torch.randn(4096) * torch.logspace(-12, 12, 4096)
    x[:6] = torch.tensor([448.0, 464.0, 480.0, float("inf"), float("-inf"), float("nan")])
    got = saturating_cast(x, "e4m3").view(torch.uint8)
    assert torch.equal(got, x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("special", [None, 0.0, float("inf"), float("-inf"), float("nan")])
def test_tensorwise_scale_is_the_max_of_abs(special):
    from fp8rl.fp8 import scale_from_amax

    x = torch.randn(33, 70) * 3.0
    if special == 0.0:
        x = torch.zeros(33, 70)
    elif special is not None:
        x[7, 9] = special
    q = quantize(x, "tensorwise", check_finite=False)
    want = scale_from_amax(x.abs().amax(), "e4m3", False)
    assert torch.equal(q.scale.isnan(), want.isnan())
    assert torch.equal(q.scale.nan_to_num(), want.nan_to_num())
