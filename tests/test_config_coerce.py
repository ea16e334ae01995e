"""config/coerce.py: YAML data and `key=value` overrides into the config dataclasses, each
value coerced to its field's type, an unknown key or a wrong type one ConfigError naming the
dotted key. An override's value is the text as typed where a string goes.

Property: every field of the run config, of every type, in every section, given a value
of a wrong type is a one-line ConfigError naming its dotted key, raised at validation before
any run folder exists; a section given as a non-mapping names the section. The fields are
found by walking the config dataclasses, so a new field is covered without a new test."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8rl.config import RunConfig, config_from_dict, load_config, parse_override
from fp8rl.config.coerce import _field_type
from fp8rl.errors import ConfigError
from helpers_config import assert_refused, refused_yaml, tiny_config


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


# ---------------------------------------------------------------------------------------
# `key=value` overrides: a string key takes the text as typed


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.lr")


OVERRIDES = {
    # (override, the dotted key, the value it must give)
    "folder_named_by_a_number": ("log.out_dir=123", "log.out_dir", "123"),
    "hash_is_no_comment": ("log.out_dir=runs/a #1", "log.out_dir", "runs/a #1"),
    "name_like_a_float": ("name=1e3", "name", "1e3"),
    "name_like_a_bool": ("name=on", "name", "on"),
    "quoted_string": ("name='x y'", "name", "x y"),
    "float_without_dot": ("train.lr=1e-3", "train.lr", 0.001),
    "null_for_optional": ("model.init_weights=null", "model.init_weights", None),
    "task_option_text": ("task.options.ops=+-", "task.options.ops", "+-"),
    "task_option_number": ("task.options.digits=3", "task.options.digits", 3),
}


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@pytest.mark.parametrize("case", list(OVERRIDES))
def test_override_values_are_what_was_typed(case):
    text, key, expected = OVERRIDES[case]
    cfg = load_config(None, [text])
    value = _get(cfg, key)
    assert value == expected and type(value) is type(expected), (value, expected)


# (override, the key the error names, what else it says)
BAD_VALUES = {
    "lr_text": ("train.lr=abc", "train.lr", ["a number"]),
    "unknown_key": ("train.unknown=1", "train.unknown", ["one of the keys"]),
    "unknown_section": ("nosection=1", "nosection", ["one of the keys"]),
    "bool_text": ("log.tensorboard=maybe", "log.tensorboard", ["true or false"]),
    "sexagesimal": ("train.steps=1:30", "train.steps", ["base-60", "(90)"]),
    "octal": ("train.seed=010", "train.seed", ["octal", "(8)"]),
    "null_for_required": ("log.out_dir=null", "log.out_dir", ["a value of type str"]),
    "empty_path": ("log.out_dir=", "log.out_dir", []),
    "unknown_key_value_shown_plain": (
        "train.lrr=1e-3",
        "train.lrr",
        ["'train.lrr' = 0.001", "one of"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_override_that_cannot_mean_what_it_shows_is_an_error(case):
    assert_refused(*BAD_VALUES[case])


def test_an_unquoted_yaml_on_where_a_string_goes_is_a_one_line_error(tmp_path):
    # YAML 1.1: an unquoted `on` is the boolean true: the error says to quote it
    message = refused_yaml(tmp_path, "name: on\n")
    assert "'name' = True" in message and "quote yes, no, on" in message, message
