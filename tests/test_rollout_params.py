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


def test_prompt_plus_new_tokens_beyond_the_model_positions_is_an_error():
    from fp8rl.models import tiny_qwen3
    from fp8rl.rollout import RolloutEngine

    engine = RolloutEngine(tiny_qwen3(max_position_embeddings=16), eos_token_id=2, pad_token_id=0)
    engine.generate([[5] * 8], SamplingParams(temperature=0, max_new_tokens=8))  # exactly fits
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        engine.generate([[5] * 8], SamplingParams(temperature=0, max_new_tokens=9))
