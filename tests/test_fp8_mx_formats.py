"""The microscaled formats' element and scale casts against ml_dtypes (float8_e4m3fn,
float4_e2m1fn, float8_e8m0fnu) and hand-derived values: saturation, ties to even,
subnormals, and the floor / rceil scale rules at and around powers of two."""

import numpy as np
import pytest
import torch

from fp8rl.fp8.mx_formats import (
    e2m1_round,
    e8m0_bits,
    e8m0_exponent,
    e8m0_to_float,
    element_cast,
    nvfp4_block_scale,
)

md = pytest.importorskip("ml_dtypes")


def every_float32_in(lo: float, hi: float, n: int, seed: int = 0) -> torch.Tensor:
    """Random magnitudes over [lo, hi) log-uniformly, both signs, plus every E2M1 / E4M3
    value, each midpoint between neighbours, and the float32 neighbours of all of them."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.exp2(torch.empty(n).uniform_(np.log2(lo), np.log2(hi), generator=g))
    grid = torch.tensor(np.arange(256, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float32))
    grid = grid[torch.isfinite(grid) & (grid >= 0)].sort().values
    mids = (grid[1:] + grid[:-1]) / 2  # exact in float32
    pts = torch.cat([grid, mids])  # E4M3's midpoints; its values hold E2M1's midpoints
    near = torch.cat([torch.nextafter(pts, pts * 2 + 1), torch.nextafter(pts, pts * 0)])
    v = torch.cat([mags, grid, mids, near])
    return torch.cat([v, -v])


def md_cast(v: torch.Tensor, dtype, vmax: float) -> torch.Tensor:
    """ml_dtypes' cast of the clamped values (fp8rl's rule: clamp, then round to nearest)."""
    a = np.clip(v.numpy(), -vmax, vmax).astype(dtype).astype(np.float32)
    return torch.from_numpy(a)


def test_e2m1_round_equals_ml_dtypes_on_values_ties_and_neighbours():
    v = every_float32_in(1e-3, 20.0, 20000)
    got = e2m1_round(v)
    assert torch.equal(got, md_cast(v, md.float4_e2m1fn, 6.0))
    # ties go to the even mantissa: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
    # 3.5 -> 4, 5 -> 4 (hand-derived from E2M1's grid 0, .5, 1, 1.5, 2, 3, 4, 6)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_round(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_round(-ties).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_e2m1_saturates_and_keeps_nan():
    v = torch.tensor([6.0, 6.5, 7.0, 1e30, float("inf"), -1e30, float("-inf")])
    assert e2m1_round(v).tolist() == [6.0, 6.0, 6.0, 6.0, 6.0, -6.0, -6.0]
    assert torch.isnan(e2m1_round(torch.tensor([float("nan")]))).all()


def test_e4m3_element_cast_equals_ml_dtypes_with_saturation():
    v = every_float32_in(2.0**-12, 2000.0, 20000, seed=1)
    got = element_cast(v, "e4m3").float()
    assert torch.equal(got, md_cast(v, md.float8_e4m3fn, 448.0))
    big = torch.tensor([448.0, 464.0, 480.0, 511.9, 1e9, -1e9])  # 480 would be NaN unclamped
    assert element_cast(big, "e4m3").float().tolist() == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]


def test_e2m1_elements_are_held_exactly_in_e4m3():
    v = every_float32_in(1e-3, 20.0, 2000, seed=2)
    assert torch.equal(element_cast(v, "e2m1").float(), e2m1_round(v))


def test_e8m0_bits_and_values_equal_ml_dtypes():
    e = torch.arange(-127, 128, dtype=torch.int32)
    bits = e8m0_bits(e, torch.ones(e.shape))
    ref = np.ldexp(1.0, e.numpy()).astype(np.float32).astype(md.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(bits.view(torch.uint8).numpy(), ref)
    all_bits = torch.arange(256, dtype=torch.uint8)
    got = e8m0_to_float(all_bits.view(torch.float8_e8m0fnu)).numpy()
    want = all_bits.numpy().view(md.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True) and np.isnan(got[255])
    nan = e8m0_bits(torch.zeros(2, dtype=torch.int32), torch.tensor([float("inf"), float("nan")]))
    assert nan.view(torch.uint8).tolist() == [255, 255]


@pytest.mark.parametrize("elem,emax,vmax", [("e4m3", 8, 448.0), ("e2m1", 2, 6.0)])
def test_floor_and_rceil_exponents_at_and_around_powers_of_two(elem, emax, vmax):
    k = torch.arange(-100, 100, dtype=torch.int32)
    p = torch.ldexp(torch.ones(k.shape), k)
    up, down = torch.nextafter(p, p * 2), torch.nextafter(p, p * 0)
    # floor(log2(amax)) is k for 2^k and just above, k - 1 just below
    assert torch.equal(e8m0_exponent(p, elem, "floor"), k - emax)
    assert torch.equal(e8m0_exponent(up, elem, "floor"), k - emax)
    assert torch.equal(e8m0_exponent(down, elem, "floor"), k - 1 - emax)
    # rceil: amax = max * 2^k fits X = 2^k exactly; a float32 ulp more needs 2^(k+1)
    at = torch.ldexp(torch.full(k.shape, vmax), k)
    assert torch.equal(e8m0_exponent(at, elem, "rceil"), k)
    assert torch.equal(e8m0_exponent(torch.nextafter(at, at * 2), elem, "rceil"), k + 1)
    assert torch.equal(e8m0_exponent(torch.nextafter(at, at * 0), elem, "rceil"), k)


@pytest.mark.parametrize("rounding", ["floor", "rceil"])
def test_exponents_equal_float64_log2_on_random_and_subnormal_amax(rounding):
    g = torch.Generator().manual_seed(3)
    amax = torch.exp2(torch.empty(5000).uniform_(-148, 127, generator=g))
    amax = torch.cat([amax, torch.tensor([0.0, 2.0**-149, 3.4e38])])
    for elem, emax, vmax in (("e4m3", 8, 448.0), ("e2m1", 2, 6.0)):
        got = e8m0_exponent(amax, elem, rounding)
        a = amax.double().numpy()
        with np.errstate(divide="ignore"):
            want = (
                np.floor(np.log2(a)) - emax if rounding == "floor" else np.ceil(np.log2(a / vmax))
            )
        want = np.clip(np.where(a > 0, want, -127), -127, 127)
        assert np.array_equal(got.numpy(), want.astype(np.int32)), elem


def test_nvfp4_block_scale_rounds_into_e4m3_subnormals_and_saturates():
    g = torch.tensor(1.0)
    # amax / 6 = 2^-9 (E4M3's smallest subnormal), 2^-10 (a tie: to 0), 3 * 2^-10 (to 2^-8),
    # 6 * 500 (saturates at 448), 0 (an all-zero block: 0)
    amax = torch.tensor([6 * 2.0**-9, 6 * 2.0**-10, 18 * 2.0**-10, 3000.0, 0.0])
    assert nvfp4_block_scale(amax, g).float().tolist() == [2.0**-9, 0.0, 2.0**-8, 448.0, 0.0]
    v = every_float32_in(2.0**-12, 600.0, 5000, seed=4).abs()
    got = nvfp4_block_scale(v * 6, g).float()
    assert torch.equal(got, md_cast((v * 6) / 6, md.float8_e4m3fn, 448.0))
