"""config/checks.py: the words config checks are written in. `between` accepts exactly the
values its interval holds (each end open or closed) and names the interval in the notation
it is checked in; `one_of` lists what is allowed; log.wandb is checked key by key."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp8rl.config.checks import WANDB_MODES, between, check_wandb, one_of
from fp8rl.errors import ConfigError

numbers = st.floats(-4, 4, allow_nan=False) | st.sampled_from([-1.0, 0.0, 1.0])


@given(x=numbers, lo_open=st.booleans(), hi_open=st.booleans())
def test_between_accepts_exactly_the_interval(x, lo_open, hi_open):
    lo, hi = -1.0, 1.0
    inside = (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    try:
        between("a.key", x, lo, hi, lo_open=lo_open, hi_open=hi_open)
    except ConfigError as e:
        assert not inside, x
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        assert e.key == "a.key" and e.value == x and interval in str(e), str(e)
    else:
        assert inside, x


@pytest.mark.parametrize(
    "value,lo_open,hi_open,ok",
    [(0, True, False, False), (0, False, False, True), (1, False, True, False), (1, 0, 0, True)],
)
def test_between_at_its_ends(value, lo_open, hi_open, ok):
    call = lambda: between("k", value, 0, 1, lo_open=lo_open, hi_open=hi_open)  # noqa: E731
    if ok:
        call()
    else:
        with pytest.raises(ConfigError):
            call()


def test_between_refuses_nan():
    with pytest.raises(ConfigError):
        between("k", math.nan, 0, 1)


def test_one_of_lists_what_is_allowed():
    one_of("k", "b", ("a", "b"))
    with pytest.raises(ConfigError) as e:
        one_of("k", "c", ("a", "b"))
    assert e.value.key == "k" and "one of ['a', 'b']" in str(e.value)


@pytest.mark.parametrize(
    "wandb,key",
    [
        ({"project": "p", "entity": "e"}, "log.wandb.entity"),
        ({"mode": "offline"}, "log.wandb.project"),
        ({"project": "  "}, "log.wandb.project"),
        ({"project": 3}, "log.wandb.project"),
        ({"project": "p", "mode": "dryrun"}, "log.wandb.mode"),
    ],
)
def test_a_bad_wandb_mapping_names_its_key(wandb, key):
    with pytest.raises(ConfigError) as e:
        check_wandb(wandb)
    assert e.value.key == key


@pytest.mark.parametrize("mode", WANDB_MODES)
def test_a_wandb_mapping_with_a_project_passes(mode):
    check_wandb({"project": "p", "mode": mode})
    check_wandb({"project": "p"})
