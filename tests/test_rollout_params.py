"""SamplingParams: validation and the greedy convention."""

import pytest

from fp8rl.errors import ConfigError
from fp8rl.rollout import SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n=0), "n"),
        (dict(n=True), "n"),
        (dict(n=2.0), "n"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=3.5), "max_new_tokens"),
        (dict(greedy=1), "greedy"),
    ],
)
def test_bad_params_name_the_field_and_value(kwargs, field):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**kwargs)
    msg = str(err.value)
    assert f"SamplingParams.{field}" in msg
    assert repr(next(iter(kwargs.values()))) in msg


def test_greedy_convention():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0).score_temperature == 1.0
    assert SamplingParams(greedy=True, temperature=0.5).is_greedy
    assert SamplingParams(greedy=True, temperature=0.5).score_temperature == 0.5
    assert not SamplingParams(temperature=0.7).is_greedy
    assert SamplingParams(temperature=0.7).score_temperature == 0.7


def test_frozen():
    p = SamplingParams()
    with pytest.raises(AttributeError):
        p.n = 3
