"""Blockwise FP8 on ragged shapes (issue 43): weights in 128x128 blocks, activations and output
gradients in 1x128 groups, the last block of a dim that is no multiple of 128 scaled by its own
amax. The three GEMMs of an Fp8Linear's training step are checked against a reference written
here from the definition with numpy and ml_dtypes: every quantized operand byte for byte and
scale for scale, every GEMM within the float32 rounding of a float64 product."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8rl.fp8.linear as linear_mod
from fp8rl.fp8 import Fp8Linear, Fp8Recipe, convert_to_fp8, quantize

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
U32 = 2.0**-24  # float32 unit roundoff
# SmolLM2-135M: hidden 576, KV width 3 x 64 = 192, intermediate 1536, vocab 49152
SMOLLM2 = {
    "q_proj/o_proj": (576, 576),
    "k_proj/v_proj": (576, 192),
    "gate_proj/up_proj": (576, 1536),
    "down_proj": (1536, 576),
}


def ref_blockwise(x: np.ndarray, fmt: str, block: tuple[int, int]):
    """(fp8 bytes, float32 scales) of x: each (bm, bk) block, the ragged last ones included,
    scaled by amax / fmt_max of its own elements (np.maximum.reduceat takes the ragged
    segments as they are), then x / scale rounded to nearest-even by ml_dtypes."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    bm, bk = block
    amax = np.maximum.reduceat(np.abs(x), np.arange(0, m, bm), axis=0)
    amax = np.maximum.reduceat(amax, np.arange(0, k, bk), axis=1)
    scale = np.maximum(amax, np.float32(1e-12)) / np.float32(FMAX[fmt])
    per_element = scale[np.arange(m)[:, None] // bm, np.arange(k)[None, :] // bk]
    q = np.clip(x / per_element, -FMAX[fmt], FMAX[fmt]).astype(np.float32)
    return q.astype(ML[fmt]).view(np.uint8), scale.astype(np.float32), per_element


def ref_dequantized(x, fmt, block) -> np.ndarray:
    data, _, per_element = ref_blockwise(x, fmt, block)
    return data.view(ML[fmt]).astype(np.float64) * per_element.astype(np.float64)


def assert_operand(got, want_source: np.ndarray, fmt: str, block: tuple[int, int]):
    data, scale, _ = ref_blockwise(want_source, fmt, block)
    assert got.granularity == "blockwise" and got.fmt == fmt and got.block == block
    np.testing.assert_array_equal(got.scale.numpy(), scale)
    np.testing.assert_array_equal(got.data.view(torch.uint8).numpy(), data)


def assert_gemm(got: torch.Tensor, a64: np.ndarray, b64: np.ndarray):
    """got ~ a64 @ b64.T to the emulation's float32 roundings: each dequantized element once
    (u) and a K-term float32 sum (K u), relative to |a| @ |b|."""
    want = a64 @ b64.T
    k = a64.shape[1]
    bound = (k + 2) * U32 * (np.abs(a64) @ np.abs(b64).T) * 1.01 + 1e-30
    err = np.abs(got.detach().double().numpy() - want)
    assert (err <= bound).all(), f"max excess {np.max(err - bound)}"


def sample(shape, seed, spread=True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if spread:  # columns of very different magnitude, as in real activations
        x = x * torch.logspace(-2, 2, shape[-1])
    return x


def train_step(m: int, k: int, n: int, grad_fmt: str, seed: int, monkeypatch):
    """One forward and backward of a blockwise Fp8Linear (k -> n) on m tokens; the operands
    and outputs of the three GEMMs, in call order."""
    recipe = Fp8Recipe.from_name("blockwise", grad_fmt=grad_fmt)
    layer = Fp8Linear(k, n, bias=False, recipe=recipe)
    with torch.no_grad():
        layer.weight.copy_(sample((n, k), seed, spread=False) / k**0.5)
    x = sample((m, k), seed + 1).requires_grad_(True)
    dy = sample((m, n), seed + 2)
    calls = []
    real = linear_mod.scaled_matmul

    def spy(a, b, *args, **kw):
        out = real(a, b, *args, **kw)
        calls.append((a, b, out))
        return out

    monkeypatch.setattr(linear_mod, "scaled_matmul", spy)
    y = layer(x)
    y.backward(dy)
    monkeypatch.setattr(linear_mod, "scaled_matmul", real)
    assert len(calls) == 3, "forward, grad input, grad weight"
    return layer.weight.detach().numpy(), x.detach().numpy(), dy.numpy(), calls, y, x.grad, layer


def check_three_gemms(m, k, n, grad_fmt, seed, monkeypatch):
    w, x, dy, calls, y, dx, layer = train_step(m, k, n, grad_fmt, seed, monkeypatch)
    act, wblk = (1, 128), (128, 128)
    (xq, wq, y_mm), (dyq, wtq, dx_mm), (dytq, xtq, dw_mm) = calls
    # forward: x in 1x128 groups along K, W in 128x128 blocks
    assert_operand(xq, x, "e4m3", act)
    assert_operand(wq, w, "e4m3", wblk)
    assert_gemm(y_mm, ref_dequantized(x, "e4m3", act), ref_dequantized(w, "e4m3", wblk))
    # grad input: dy along N; W^T's blocks are W's, transposed (a block's amax has no side)
    assert_operand(dyq, dy, grad_fmt, act)
    assert_operand(wtq, w.T, "e4m3", wblk)
    assert_gemm(dx_mm, ref_dequantized(dy, grad_fmt, act), ref_dequantized(w.T, "e4m3", wblk))
    # grad weight: dy^T and x^T, both in 1x128 groups along the tokens
    assert_operand(dytq, dy.T, grad_fmt, act)
    assert_operand(xtq, x.T, "e4m3", act)
    assert_gemm(dw_mm, ref_dequantized(dy.T, grad_fmt, act), ref_dequantized(x.T, "e4m3", act))
    # what autograd hands back is those GEMMs' results
    assert torch.equal(y, y_mm) and torch.equal(dx, dx_mm)
    assert torch.equal(layer.weight.grad, dw_mm)


@pytest.mark.parametrize("shape", list(SMOLLM2.values()), ids=list(SMOLLM2))
def test_the_three_gemms_on_smollm2_shapes(shape, monkeypatch):
    k, n = shape
    # 131 tokens: the grad-weight GEMM contracts over them, 128 + a ragged group of 3
    check_three_gemms(131, k, n, "e4m3", seed=k + n, monkeypatch=monkeypatch)


@pytest.mark.slow
def test_the_three_gemms_on_the_smollm2_lm_head_shape(monkeypatch):
    check_three_gemms(5, 576, 49152, "e4m3", seed=3, monkeypatch=monkeypatch)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 300),
    k=st.integers(1, 300),
    n=st.integers(1, 300),
    grad_fmt=st.sampled_from(["e4m3", "e5m2"]),
)
def test_the_three_gemms_on_any_shape(m, k, n, grad_fmt):
    with pytest.MonkeyPatch.context() as mp:
        check_three_gemms(m, k, n, grad_fmt, seed=m * 7 + k * 3 + n, monkeypatch=mp)


def test_a_ragged_edge_block_has_its_own_scale():
    # hand-made 130 x 130: block amaxes 224 (scale 0.5) but the ragged 2 x 2 corner's 896
    # (scale 2), which a scale shared with a whole block, or padded differently, would miss
    w = torch.full((130, 130), 0.25)
    w[0, 0] = w[0, 129] = w[129, 0] = 224.0
    w[128:, 128:] = 896.0
    q = quantize(w, "blockwise", block=(128, 128))
    assert q.scale.tolist() == [[0.5, 0.5], [0.5, 2.0]]
    assert torch.equal(q.dequantize(), w)  # every element a representable multiple: exact


def test_blockwise_converts_every_smollm2_projection():
    # was: alignment 128 kept every projection of a 576-wide model in high precision
    model = torch.nn.ModuleDict(
        {name: torch.nn.Linear(k, n, bias=False) for name, (k, n) in SMOLLM2.items()}
    )
    report = convert_to_fp8(model, "blockwise")
    assert sorted(report.converted) == sorted(SMOLLM2) and not report.skipped
    assert Fp8Recipe.from_name("blockwise").alignment == 16


def test_blockwise_still_refuses_dims_no_fp8_kernel_takes():
    # a dim that is no multiple of 16 (the FP8 GEMM kernels' alignment) is kept, with why
    model = torch.nn.ModuleDict({"odd": torch.nn.Linear(576, 200), "ok": torch.nn.Linear(576, 192)})
    report = convert_to_fp8(model, "blockwise")
    assert report.converted == ["ok"]
    assert "not multiples of 16" in report.skipped["odd"], report.skipped
