"""quantize / dequantize against an independent numpy + ml_dtypes reference, error bounds,
scale shapes, odd shapes and bad input."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.fp8 import Fp8Tensor, quantize

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
# Half an ulp relative to |x| in the normal range, half the smallest subnormal step
# (in units of the scale) below it: 3 and 2 mantissa bits, min subnormals 2^-9 and 2^-16.
REL = {"e4m3": 2.0**-4, "e5m2": 2.0**-3}
SUB = {"e4m3": 2.0**-10, "e5m2": 2.0**-17}


def ref_groups(m, k, granularity, block):
    if granularity == "tensorwise":
        yield (0, 0), (slice(0, m), slice(0, k))
    elif granularity == "rowwise":
        for i in range(m):
            yield (i, 0), (slice(i, i + 1), slice(0, k))
    else:
        bm, bk = block
        for i in range(math.ceil(m / bm)):
            for j in range(math.ceil(k / bk)):
                yield (i, j), (slice(i * bm, (i + 1) * bm), slice(j * bk, (j + 1) * bk))


def ref_quantize(x: np.ndarray, granularity, fmt, block=(1, 128), pow2=False):
    """Group by group with numpy float32 arithmetic and ml_dtypes casts."""
    m, k = x.shape
    x = x.astype(np.float32)
    if granularity == "tensorwise":
        scales = np.zeros((1, 1), np.float32)
    elif granularity == "rowwise":
        scales = np.zeros((m, 1), np.float32)
    else:
        scales = np.zeros((math.ceil(m / block[0]), math.ceil(k / block[1])), np.float32)
    data = np.zeros((m, k), np.uint8)
    for idx, sl in ref_groups(m, k, granularity, block):
        amax = max(np.float32(np.abs(x[sl]).max()), np.float32(1e-12))
        s = np.float32(amax / np.float32(FMAX[fmt]))
        if pow2:
            mant, e = math.frexp(float(s))
            s = np.float32(2.0 ** (e - 1) if mant == 0.5 else 2.0**e)
        scales[idx] = s
        q = np.clip(x[sl] / s, -FMAX[fmt], FMAX[fmt]).astype(np.float32)
        data[sl] = q.astype(ML[fmt]).view(np.uint8)
    if granularity == "tensorwise":
        scales = scales.reshape(())
    return data, scales


def bits(t: Fp8Tensor) -> np.ndarray:
    return t.data.view(torch.uint8).numpy()


def sample(m, k, seed=0, spread=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    if spread:  # rows and columns of very different magnitude, as in real activations
        x = x * torch.logspace(-3, 3, m)[:, None] * torch.logspace(-1, 1, k)[None, :]
    return x


CASES = [
    ("tensorwise", "e4m3", (1, 128)),
    ("tensorwise", "e5m2", (1, 128)),
    ("rowwise", "e4m3", (1, 128)),
    ("rowwise", "e5m2", (1, 128)),
    ("blockwise", "e4m3", (1, 128)),
    ("blockwise", "e4m3", (128, 128)),
    ("blockwise", "e5m2", (32, 64)),
]


@pytest.mark.parametrize("granularity,fmt,block", CASES)
@pytest.mark.parametrize("pow2", [False, True])
def test_matches_reference_bit_for_bit(granularity, fmt, block, pow2):
    x = sample(150, 300, seed=1)  # neither dim a multiple of 128: partial edge blocks
    q = quantize(x, granularity, fmt=fmt, block=block, pow2_scales=pow2)
    data, scales = ref_quantize(x.numpy(), granularity, fmt, block, pow2)
    np.testing.assert_array_equal(q.scale.numpy(), scales)
    np.testing.assert_array_equal(bits(q), data)


@pytest.mark.parametrize(
    "granularity,block,shape",
    [
        ("tensorwise", (1, 128), ()),
        ("rowwise", (1, 128), (150, 1)),
        ("blockwise", (1, 128), (150, 3)),
        ("blockwise", (128, 128), (2, 3)),
        ("blockwise", (64, 32), (3, 10)),
    ],
)
def test_scale_shapes(granularity, block, shape):
    q = quantize(sample(150, 300), granularity, block=block)
    assert q.scale.shape == shape and q.scale.dtype == torch.float32
    assert q.data.shape == (150, 300) and q.data.dtype == torch.float8_e4m3fn
    assert q.granularity == granularity


def err_bound(x64, q: Fp8Tensor):
    s = q.full_scale(torch.float64).expand_as(x64)
    return REL[q.fmt] * x64.abs() * (1 + 1e-6) + SUB[q.fmt] * s * (1 + 1e-6)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 300),
    case=st.sampled_from(CASES),
    pow2=st.booleans(),
    log_mag=st.floats(-30, 30),
    seed=st.integers(0, 2**16),
)
def test_error_bound_property(m, k, case, pow2, log_mag, seed):
    granularity, fmt, block = case
    x = sample(m, k, seed=seed) * 2.0**log_mag
    q = quantize(x, granularity, fmt=fmt, block=block, pow2_scales=pow2)
    x64 = x.double()
    err = (q.dequantize(torch.float64) - x64).abs()
    assert (err <= err_bound(x64, q)).all()
    assert q.data.float().abs().max() <= FMAX[fmt]
    # The scale is not wasteful: each group's largest element lands in the top binade.
    top = q.data.float().abs().max().item()
    assert top >= FMAX[fmt] / (2.0 if pow2 else 1.0) / (1 + REL[fmt]) or x.abs().max() < 1e-11


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise", "blockwise"])
def test_finer_granularity_is_not_worse_on_spread_rows(granularity):
    """Rows 6 decades apart: per-row and per-block scales keep the small rows' precision."""
    x = sample(64, 256, seed=3).double()
    q = quantize(x.float(), granularity)
    rel_err = ((q.dequantize(torch.float64) - x).norm(dim=1) / x.norm(dim=1)).max().item()
    if granularity == "tensorwise":
        assert rel_err > 0.1  # the smallest rows fall into the subnormals or flush to zero
    else:
        assert 1e-3 < rel_err < 0.05


def test_pow2_scales_are_powers_of_two_rounded_up():
    x = sample(40, 256, seed=4)
    exact = quantize(x, "rowwise").scale.double()
    p2 = quantize(x, "rowwise", pow2_scales=True).scale.double()
    mant, _ = torch.frexp(p2)
    assert (mant == 0.5).all()
    assert (p2 >= exact).all() and (p2 < 2 * exact).all()


def test_zero_tensor_and_floor():
    q = quantize(torch.zeros(4, 32), "rowwise")
    assert torch.equal(q.dequantize(), torch.zeros(4, 32))
    assert torch.allclose(q.scale, torch.full((4, 1), 1e-12 / 448))


def test_bfloat16_input_quantizes_its_exact_values():
    xb = sample(33, 130, seed=5).to(torch.bfloat16)
    q = quantize(xb, "blockwise", block=(1, 128))
    data, scales = ref_quantize(xb.float().numpy(), "blockwise", "e4m3", (1, 128))
    np.testing.assert_array_equal(bits(q), data)
    np.testing.assert_array_equal(q.scale.numpy(), scales)


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise", "blockwise"])
def test_3d_flattens_leading_dims(granularity):
    x = sample(6 * 7, 256, seed=6)
    q3 = quantize(x.reshape(6, 7, 256), granularity)
    q2 = quantize(x, granularity)
    assert q3.data.shape == (6, 7, 256)
    assert torch.equal(q3.data.view(torch.uint8).reshape(42, 256), q2.data.view(torch.uint8))
    assert torch.equal(q3.scale, q2.scale)
    assert torch.equal(q3.dequantize(), q2.dequantize().reshape(6, 7, 256))


@pytest.mark.parametrize(
    "granularity,shape", [("tensorwise", ()), ("rowwise", (1, 1)), ("blockwise", (1, 2))]
)
def test_1d_is_one_row(granularity, shape):
    x = torch.linspace(-3, 5, 200)
    q = quantize(x, granularity)
    assert q.data.shape == (200,) and q.scale.shape == shape
    assert (q.dequantize() - x).abs().max() <= 5 * REL["e4m3"]


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise", "blockwise"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_nonfinite_input_raises_naming_the_tensor(granularity, bad):
    x = torch.randn(8, 256)
    x[5, 200] = bad
    with pytest.raises(FloatingPointError, match="layer3.input"):
        quantize(x, granularity, name="layer3.input")


def test_unchecked_nonfinite_gives_nonfinite_scale_not_a_wrong_finite_one():
    x = torch.randn(8, 256)
    x[5, 200] = float("nan")
    q = quantize(x, "rowwise", check_finite=False)
    assert not torch.isfinite(q.scale[5]).any() and torch.isfinite(q.scale[:5]).all()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(granularity="colwise"), "colwise"),
        (dict(granularity="rowwise", fmt="e3m4"), "e3m4"),
        (dict(granularity="blockwise", block=(0, 128)), r"block=\(0, 128\)"),
        (dict(granularity="blockwise", block=(128,)), "block"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize(torch.randn(4, 16), **kwargs)


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.tensor(3.0), r"shape \(\)"),
        (torch.zeros(0, 16), r"shape \(0, 16\)"),
        (torch.ones(4, 16, dtype=torch.int32), "int32"),
        (torch.ones(4, 16).to(torch.float8_e4m3fn), "float8"),
    ],
)
def test_unquantizable_inputs_raise_clearly(x, match):
    with pytest.raises(ValueError, match=match):
        quantize(x, "tensorwise", name="probe")


@pytest.mark.parametrize(
    "granularity,block",
    [("tensorwise", (1, 128)), ("blockwise", (128, 128)), ("blockwise", (32, 64))],
)
def test_transpose_equals_quantizing_the_transpose(granularity, block):
    x = sample(150, 300, seed=7)
    q = quantize(x, granularity, block=block)
    qt = quantize(x.t(), granularity, block=(block[1], block[0]))
    t = q.t()
    assert torch.equal(t.data.view(torch.uint8), qt.data.view(torch.uint8))
    assert torch.equal(t.scale, qt.scale) and t.block == qt.block


def test_rowwise_transpose_refused():
    with pytest.raises(ValueError, match="rowwise"):
        quantize(torch.randn(4, 16), "rowwise").t()


def test_fp8tensor_rejects_inconsistent_fields():
    q = quantize(torch.randn(4, 16), "rowwise")
    with pytest.raises(ValueError, match="scale.shape"):
        Fp8Tensor(q.data, torch.ones(3, 1), "rowwise", q.block, "e4m3")
    with pytest.raises(ValueError, match="e5m2"):
        Fp8Tensor(q.data, q.scale, "rowwise", q.block, "e5m2")


@pytest.mark.slow
@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise", "blockwise"])
def test_compiled_quantizer_matches_eager(granularity):
    """The torch.compile'd kernels CUDA uses, compiled by inductor for the CPU here (slow):
    odd M, M = 1, partial blocks and transposed inputs, one graph per key."""
    from fp8rl.fp8.fused import fused_report

    xs = [
        sample(72, 200, seed=8),
        sample(256, 40, seed=9).t(),
        sample(37, 256, seed=10),
        sample(1, 256, seed=11),
        sample(130, 768, seed=12),
        sample(300, 130, seed=13).t(),
    ]
    for x in xs:
        for block in ((1, 128), (128, 128)) if granularity == "blockwise" else ((1, 128),):
            a = quantize(x, granularity, fused=True, block=block)
            b = quantize(x, granularity, fused=False, block=block)
            assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
            assert torch.equal(a.scale, b.scale)
    report = [r for r in fused_report() if r["granularity"] == granularity]
    assert report and all(r["fallback"] is None and r["compiles"] <= 2 for r in report), report
