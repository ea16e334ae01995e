"""Fp8Recipe: the paper's three recipes and clear errors for anything else."""

import dataclasses

import pytest

from fp8rl.fp8 import Fp8Recipe, as_recipe


def test_the_three_recipes():
    t, r, b = (Fp8Recipe.from_name(n) for n in ("tensorwise", "rowwise", "blockwise"))
    assert (t.granularity, t.fwd_fmt, t.grad_fmt) == ("tensorwise", "e4m3", "e5m2")
    assert (r.granularity, r.fwd_fmt, r.grad_fmt) == ("rowwise", "e4m3", "e4m3")
    assert (b.granularity, b.fwd_fmt, b.grad_fmt) == ("blockwise", "e4m3", "e4m3")
    assert b.act_block == (1, 128) and b.weight_block == (128, 128)
    assert (t.alignment, r.alignment, b.alignment) == (16, 16, 128)
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
    with pytest.raises(ValueError, match=r"'colwise'.*\['blockwise', 'rowwise', 'tensorwise'\]"):
        Fp8Recipe.from_name("colwise")


def test_as_recipe_accepts_a_recipe_a_name_or_none():
    r = Fp8Recipe.from_name("rowwise")
    assert as_recipe(r) is r and as_recipe(None) is None
    assert as_recipe("blockwise") == Fp8Recipe.from_name("blockwise")
    with pytest.raises(TypeError, match=r"recipe=3 .*\['blockwise', 'rowwise', 'tensorwise'\]"):
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
