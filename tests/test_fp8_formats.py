"""The saturating FP8 cast against ml_dtypes, an independent implementation of both formats."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.fp8 import fmt_max, saturating_cast

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def reference_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' round-to-nearest-even cast after the same clamp to [-max, max]."""
    m = float(ml_dtypes.finfo(ML[fmt]).max)
    return np.clip(x, -m, m).astype(ML[fmt]).view(np.uint8)


def our_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    return saturating_cast(torch.from_numpy(x), fmt).view(torch.uint8).numpy()


def probe_values(fmt: str) -> np.ndarray:
    fi = ml_dtypes.finfo(ML[fmt])
    tiny, smallest_sub, m = float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.max)
    rng = np.random.default_rng(0)
    vals = [
        rng.standard_normal(4000) * 10.0 ** rng.uniform(-3, 3, 4000),  # random, many decades
        rng.uniform(-tiny, tiny, 2000),  # subnormal range
        np.arange(-8, 9) * smallest_sub / 2,  # half-way between subnormals
        np.array(
            [m, -m, np.nextafter(m, 0), m * 1.01, -m * 1.01, m * 1000, 1e30, -1e30]
        ),  # max, beyond max
        np.array([0.0, -0.0, 1.0, -1.0, tiny, -tiny, smallest_sub, smallest_sub / 2]),
    ]
    return np.concatenate(vals).astype(np.float32)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_bits_match_ml_dtypes_float32(fmt):
    x = probe_values(fmt)
    np.testing.assert_array_equal(our_bits(x, fmt), reference_bits(x, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_bits_match_ml_dtypes_bfloat16(fmt):
    x32 = probe_values(fmt)
    xb = torch.from_numpy(x32).to(torch.bfloat16)
    ours = saturating_cast(xb, fmt).view(torch.uint8).numpy()
    ref = reference_bits(xb.float().numpy().astype(ml_dtypes.bfloat16).astype(np.float32), fmt)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("fmt,expected", [("e4m3", 448.0), ("e5m2", 57344.0)])
def test_format_max_and_saturation(fmt, expected):
    assert fmt_max(fmt) == expected == float(ml_dtypes.finfo(ML[fmt]).max)
    out = saturating_cast(torch.tensor([1e5, -1e5, 500.0, 6e4]), fmt).float()
    assert torch.isfinite(out).all()
    assert out.abs().max().item() == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=64),
    st.sampled_from(["e4m3", "e5m2"]),
)
def test_cast_property_any_finite_float32(values, fmt):
    x = np.asarray(values, dtype=np.float32)
    np.testing.assert_array_equal(our_bits(x, fmt), reference_bits(x, fmt))


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="e4m2"):
        saturating_cast(torch.ones(2), "e4m2")
