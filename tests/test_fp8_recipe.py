"""Fp8Recipe: the paper's three recipes, the block-scaled three, and clear errors for anything
else."""

import dataclasses

import pytest

from fp8rl.fp8 import Fp8Recipe, as_recipe


def test_the_three_recipes():
    t, r, b = (Fp8Recipe.from_name(n) for n in ("tensorwise", "rowwise", "blockwise"))
    assert (t.granularity, t.fwd_fmt, t.grad_fmt) == ("tensorwise", "e4m3", "e5m2")
    assert (r.granularity, r.fwd_fmt, r.grad_fmt) == ("rowwise", "e4m3", "e4m3")
    assert (b.granularity, b.fwd_fmt, b.grad_fmt) == ("blockwise", "e4m3", "e4m3")
    assert b.act_block == (1, 128) and b.weight_block == (128, 128)
    assert (t.alignment, r.alignment, b.alignment) == (16, 16, 16)
    assert not any(x.pow2_scales for x in (t, r, b))


def test_frozen_and_hashable():
    r = Fp8Recipe.from_name("rowwise")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.granularity = "tensorwise"
    assert {r: 1}[Fp8Recipe.from_name("rowwise")] == 1
    assert r != Fp8Recipe.from_name("rowwise", pow2_scales=True)


def test_overrides_and_list_blocks():
    r = Fp8Recipe.from_name("blockwise", act_block=[1, 64], pow2_scales=True)
    assert r.act_block == (1, 64) and r.pow2_scales and hash(r)
    assert r.replace(name="b64").name == "b64"


def test_unknown_name_lists_valid_ones():
    with pytest.raises(
        ValueError,
        match=r"'colwise'.*\['blockwise', 'mxfp4', 'mxfp8', 'nvfp4', 'rowwise', 'tensorwise'\]",
    ):
        Fp8Recipe.from_name("colwise")


def test_as_recipe_accepts_a_recipe_a_name_or_none():
    r = Fp8Recipe.from_name("rowwise")
    assert as_recipe(r) is r and as_recipe(None) is None
    assert as_recipe("blockwise") == Fp8Recipe.from_name("blockwise")
    with pytest.raises(
        TypeError,
        match=r"recipe=3 .*\['blockwise', 'mxfp4', 'mxfp8', 'nvfp4', 'rowwise', 'tensorwise'\]",
    ):
        as_recipe(3)


def test_unknown_field_lists_valid_ones():
    with pytest.raises(ValueError, match=r"\['block_size'\].*grad_fmt"):
        Fp8Recipe.from_name("rowwise", block_size=64)
    with pytest.raises(ValueError, match="foo"):
        Fp8Recipe.from_name("rowwise").replace(foo=1)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(granularity="colwise"), "granularity='colwise'"),
        (dict(fwd_fmt="e4m3fnuz"), "fwd_fmt='e4m3fnuz'"),
        (dict(fwd_fmt="e5m2", grad_fmt="e5m2"), "e5m2 x e5m2"),
        (dict(weight_block=(128, 0)), "weight_block"),
        (dict(pow2_scales="yes"), "pow2_scales='yes'"),
    ],
)
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8Recipe.from_name("rowwise", **kwargs)


def test_the_block_scaled_recipes():
    m8, m4, nv = (Fp8Recipe.from_name(n) for n in ("mxfp8", "mxfp4", "nvfp4"))
    assert (m8.granularity, m8.fwd_fmt, m8.grad_fmt, m8.hp_backward) == (
        "mx",
        "e4m3",
        "e4m3",
        False,
    )
    assert (m4.granularity, m4.fwd_fmt, m4.hp_backward) == ("mx", "e2m1", True)
    assert (nv.granularity, nv.fwd_fmt, nv.hp_backward) == ("nvfp4", "e2m1", True)
    assert [r.block_format for r in (m8, m4, nv)] == ["mxfp8", "mxfp4", "nvfp4"]
    assert [r.block_size for r in (m8, m4, nv)] == [32, 32, 16]
    assert {r.alignment for r in (m8, m4, nv)} == {32}
    assert m8.scale_rounding == "floor"
    assert Fp8Recipe.from_name("mxfp8", scale_rounding="rceil").scale_rounding == "rceil"
    assert Fp8Recipe.from_name("rowwise").block_size is None


def test_gemm_precisions_say_where_the_backward_runs():
    assert set(Fp8Recipe.from_name("mxfp8").gemm_precisions().values()) == {"mxfp8 floor"}
    for name in ("mxfp4", "nvfp4"):
        g = Fp8Recipe.from_name(name).gemm_precisions()
        assert g["forward"].startswith(name)
        assert "high precision" in g["grad_input"] and "high precision" in g["grad_weight"]
    assert "e5m2" in Fp8Recipe.from_name("tensorwise").gemm_precisions()["grad_input"]


@pytest.mark.parametrize(
    "name,kwargs,match",
    [
        ("mxfp8", dict(scale_rounding="ceil"), r"scale_rounding='ceil'.*\['floor', 'rceil'\]"),
        ("nvfp4", dict(scale_rounding="rceil"), "scale_rounding applies to granularity 'mx'"),
        ("rowwise", dict(scale_rounding="rceil"), "scale_rounding applies"),
        ("mxfp4", dict(hp_backward=False), "hp_backward=False with 4-bit"),
        ("rowwise", dict(fwd_fmt="e2m1"), "fwd_fmt='e2m1' does not fit granularity 'rowwise'"),
        ("nvfp4", dict(fwd_fmt="e4m3"), r"fwd_fmt='e4m3' does not fit .*\['e2m1'\]"),
        ("mxfp8", dict(grad_fmt="e5m2"), "grad_fmt='e5m2'"),
        ("mxfp8", dict(pow2_scales=True), "pow2_scales=True applies to the FP8"),
        ("mxfp8", dict(hp_backward="no"), "hp_backward='no' must be a bool"),
        ("mxfp8", dict(granularity="mx4"), "granularity='mx4'"),
    ],
)
def test_bad_block_scaled_values_are_named(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8Recipe.from_name(name, **kwargs)
