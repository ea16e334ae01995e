"""Properties of `fake_quantize` that follow from the formats' definitions, checked by
hypothesis on random shapes, magnitudes and distributions: idempotence, sign symmetry,
invariance of the block-scaled casts under powers of two, and zero padding that never
changes a result. Plus its contract: shape, dtype, options, errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.fp8 import RECIPES, Fp8Recipe, fake_quantize, quantize_mx

BLOCK_SCALED = ["mxfp8", "mxfp4", "nvfp4"]
# (recipe, options): both MX scale roundings
CASTS = [("mxfp8", {}), ("mxfp8", {"scale_rounding": "rceil"}), ("mxfp4", {})]
CASTS += [("mxfp4", {"scale_rounding": "rceil"}), ("nvfp4", {})]


def sample(m, k, log_mag, heavy, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    if heavy:  # Student t with 2 dof: normal over sqrt(chi2_2 / 2)
        x = x / torch.sqrt(-torch.log(torch.rand(m, k, generator=g).clamp_min(1e-30)))
    zero_rows = torch.rand(m, 1, generator=g) < 0.2
    return torch.where(zero_rows, 0.0, x) * 2.0**log_mag


shapes = dict(
    m=st.integers(1, 9),
    k=st.integers(1, 100),
    log_mag=st.integers(-30, 30),
    heavy=st.booleans(),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASTS), **shapes)
def test_idempotent_and_sign_symmetric(case, m, k, log_mag, heavy, seed):
    name, opts = case
    x = sample(m, k, log_mag, heavy, seed)
    y = fake_quantize(x, name, **opts)
    assert torch.equal(fake_quantize(-x, name, **opts), -y)
    if name != "nvfp4":
        assert torch.equal(fake_quantize(y, name, **opts), y)
        return
    # NVFP4's tensor scale g = amax / 2688 is rounded: the second cast's amax (2688 g) can
    # be an ulp off, moving g by an ulp; its elements and block scales are the same
    q, q2 = quantize_mx(x, name), quantize_mx(y, name)
    assert torch.equal(q2.data, q.data) and torch.equal(q2.scale, q.scale)
    assert torch.allclose(q2.global_scale, q.global_scale, rtol=2**-22, atol=0)
    assert torch.allclose(q2.dequantize(), y, rtol=2**-21, atol=0)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASTS), shift=st.integers(-20, 20), **shapes)
def test_powers_of_two_commute_with_the_block_scaled_casts(case, shift, m, k, log_mag, heavy, seed):
    name, opts = case
    x = sample(m, k, log_mag, heavy, seed)
    assert torch.equal(
        fake_quantize(x * 2.0**shift, name, **opts), fake_quantize(x, name, **opts) * 2.0**shift
    )


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASTS), pad_k=st.integers(1, 70), pad_m=st.integers(0, 3), **shapes)
def test_zero_padding_never_changes_a_result(case, pad_k, pad_m, m, k, log_mag, heavy, seed):
    name, opts = case
    x = sample(m, k, log_mag, heavy, seed)
    padded = torch.nn.functional.pad(x, (0, pad_k, 0, pad_m))
    assert torch.equal(fake_quantize(padded, name, **opts)[:m, :k], fake_quantize(x, name, **opts))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["tensorwise", "rowwise", "blockwise"]), **shapes)
def test_fp8_recipes_sign_symmetric_and_near_idempotent(name, m, k, log_mag, heavy, seed):
    # amax / 448 is rounded, so a second cast can move a value by float32 rounding only
    x = sample(m, k, log_mag, heavy, seed)
    y = fake_quantize(x, name)
    assert torch.equal(fake_quantize(-x, name), -y)
    assert torch.allclose(fake_quantize(y, name), y, rtol=2**-22, atol=0)


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_same_shape_and_dtype_and_the_recipes_forward_cast(name, dtype):
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = fake_quantize(x, name)
    assert y.shape == x.shape and y.dtype == dtype
    assert not torch.equal(y, x)  # it did quantize
    r = Fp8Recipe.from_name(name)
    if r.block_format:
        # float32 dequantization as torchao's (g * s_b first), exact in float64
        work = torch.float64 if dtype == torch.float64 else torch.float32
        assert torch.equal(y, quantize_mx(x, r.block_format).dequantize(work).to(dtype))
    rel = ((y.double() - x.double()).norm() / x.double().norm()).item()
    assert rel < (0.2 if r.fwd_fmt == "e2m1" else 0.05)


def test_options_and_recipes_are_taken_as_the_rest_of_the_api_takes_them():
    x = torch.randn(8, 64) * 3
    rceil = fake_quantize(x, "mxfp8", scale_rounding="rceil")
    assert torch.equal(
        rceil, fake_quantize(x, Fp8Recipe.from_name("mxfp8", scale_rounding="rceil"))
    )
    assert not torch.equal(rceil, fake_quantize(x, "mxfp8"))  # floor saturates, rceil does not
    w = torch.randn(256, 256)
    assert not torch.equal(
        fake_quantize(w, "blockwise", weight=True), fake_quantize(w, "blockwise")
    )
    with pytest.raises(ValueError, match="recipe=None is high precision"):
        fake_quantize(x, None)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['block'\]"):
        fake_quantize(x, "mxfp8", block=16)
    with pytest.raises(ValueError, match="scale_rounding applies to granularity 'mx'"):
        fake_quantize(x, "nvfp4", scale_rounding="rceil")
    with pytest.raises(FloatingPointError, match="fake_quantize input"):
        fake_quantize(torch.tensor([[1.0, float("nan")]]), "nvfp4")
