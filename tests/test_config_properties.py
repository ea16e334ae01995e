"""Property: every field of the run config, of every type, in every section, given a value
of a wrong type is a one-line ConfigError naming its dotted key, raised at validation before
any run folder exists; a section given as a non-mapping names the section. The fields are
found by walking the config dataclasses, so a new field is covered without a new test."""

from __future__ import annotations

import dataclasses
import math
import typing

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8rl.config import RunConfig, config_from_dict
from fp8rl.config.build import _field_type
from fp8rl.errors import ConfigError
from helpers_config import tiny_config


def _fields(cls=RunConfig, prefix: str = ""):
    """(dotted key, type, takes None) of every leaf field, nested sections walked."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _fields(type(default), key + ".")
        else:
            yield (key, *_field_type(hints[f.name]))


FIELDS = list(_fields())
SECTIONS = [
    f.name for f in dataclasses.fields(RunConfig) if f.default_factory is not dataclasses.MISSING
]

texts = st.text(min_size=1, max_size=8).filter(lambda s: not _number(s))
fractions = st.floats(allow_nan=True, allow_infinity=True).filter(
    lambda x: not (math.isfinite(x) and x.is_integer())
)
containers = st.one_of(
    st.lists(st.integers(), min_size=1, max_size=3),
    st.dictionaries(texts, st.integers(), min_size=1, max_size=2),
)
# values no field of the type can take: the wrong type for it, whatever its range
WRONG = {
    int: st.one_of(texts, fractions, st.booleans(), containers),
    float: st.one_of(texts, st.booleans(), containers),
    bool: st.one_of(texts, st.integers(), st.floats(), containers),
    str: st.one_of(st.integers(), st.floats(), st.booleans(), containers),
    dict: st.one_of(
        texts, st.integers(), st.floats(), st.booleans(), st.lists(st.integers(), max_size=3)
    ),
    list: st.one_of(texts, st.integers(), st.booleans(), st.lists(st.integers(), min_size=1)),
    tuple: st.one_of(texts, st.integers(), st.booleans(), st.lists(texts, min_size=1, max_size=3)),
}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _with(data: dict, key: str, value) -> dict:
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def _bad_value(draw_field):
    key, kind, optional = draw_field
    return WRONG[kind].map(lambda v: (key, v))


def test_the_walk_finds_every_section_and_type():
    kinds = {kind for _, kind, _ in FIELDS}
    assert kinds == set(WRONG), kinds  # a new type of field needs its wrong values above
    assert {key.split(".")[0] for key, *_ in FIELDS} >= set(SECTIONS)
    assert len(FIELDS) > 60


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=st.sampled_from(FIELDS).flatmap(_bad_value))
def test_a_wrong_typed_value_of_any_field_is_one_line_naming_its_key(tmp_path, case):
    key, value = case
    run = tmp_path / "run"
    data = _with(tiny_config(run), key, value)
    try:
        config_from_dict(data)
    except ConfigError as e:
        text = str(e)
        assert e.key == key or e.key.startswith(key + "."), (key, value, text)
        assert "\n" not in text
    else:
        raise AssertionError(f"{key} = {value!r} validated")
    assert not run.exists()


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    section=st.sampled_from(SECTIONS),
    value=st.one_of(
        st.just(0),
        st.just(False),
        st.just(""),
        st.integers(),
        texts,
        st.lists(st.integers(), max_size=2),
    ),
)
def test_a_section_that_is_no_mapping_is_refused_naming_it(tmp_path, section, value):
    """Was: `train: 0` ran with every default."""
    data = tiny_config(tmp_path / "run")
    data[section] = value
    try:
        config_from_dict(data)
    except ConfigError as e:
        assert e.key == section, (section, value, str(e))
    else:
        raise AssertionError(f"{section}: {value!r} validated")
