"""Building a config dataclass from YAML data and `key=value` overrides (sections.py):
each value coerced to its field's type, an unknown key or a wrong type one ConfigError naming
the dotted key."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, fields
from typing import Any

import yaml

from ..errors import ConfigError
from .yaml_strict import YamlMeaningError, load_yaml


@dataclass(frozen=True)
class Override:
    """A `key=value` override: the text as typed and what YAML reads in it. A string key takes
    the text, so `--out 123` or `log.out_dir=runs/a #1` is the folder typed, not a number or
    a YAML comment; null, ~ and an empty value read as null wherever they are written."""

    text: str
    value: Any

    def for_string(self) -> Any:
        quoted = len(self.text) > 1 and self.text[0] == self.text[-1] and self.text[0] in "'\""
        return self.value if self.value is None or quoted else self.text


def _plain(value: Any) -> Any:
    """Overrides inside a free-form mapping (task.options, model.tiny): strings as typed,
    everything else as YAML reads it."""
    if isinstance(value, Override):
        return value.for_string() if isinstance(value.value, str) else value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _field_type(hint: Any) -> tuple[type, bool]:
    """(the field's type, whether it takes None) from its annotation: `float | None` is
    (float, True), `dict[str, int]` (dict, False)."""
    args = typing.get_args(hint)
    optional = type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType)
    if optional:
        (hint,) = [a for a in args if a is not type(None)]
    return typing.get_origin(hint) or hint, optional


def _coerce(key: str, value: Any, kind: type, optional: bool) -> Any:
    """Coerce a YAML/CLI value to the field's type `kind` (None allowed when `optional`), with
    an error naming the key."""
    if isinstance(value, Override):
        value = value.for_string() if kind is str else value.value
    if value is None:
        if optional:
            return None
        raise ConfigError(key, value, f"a value of type {kind.__name__}")
    if kind is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, value, "a mapping")
        return _plain(value)
    if kind is tuple:
        numbers = isinstance(value, (list, tuple)) and all(
            not isinstance(v, bool) and isinstance(v, (int, float)) for v in value
        )
        if not numbers:
            raise ConfigError(key, value, "a list of numbers, e.g. [0.9, 0.999]")
        return tuple(float(v) for v in value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(key, value, "an integer")
        return value
    if kind is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(key, value, "a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number")
        return float(value)
    if kind is str:
        if isinstance(value, bool):  # YAML 1.1: unquoted yes/no/on/off are booleans
            raise ConfigError(key, value, "a string (quote yes, no, on, off, true, false)")
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string")
        return value
    return value


def _build(cls, data: dict, prefix: str):
    if isinstance(data, Override):
        data = data.value
    if not isinstance(data, dict):
        raise ConfigError(prefix or "<root>", data, "a mapping")
    known = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)  # the annotations as types, not as their text
    unknown = sorted(set(data) - set(known))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"{where}{unknown[0]}", _plain(data[unknown[0]]), f"one of the keys {sorted(known)}"
        )
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            continue
        key = f"{prefix}.{name}" if prefix else name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            # an empty section (`train:`) is its defaults; 0, false or '' is no section
            section = {} if data[name] is None else data[name]
            kwargs[name] = _build(type(default), section, key)
        else:
            kwargs[name] = _coerce(key, data[name], *_field_type(hints[name]))
    return cls(**kwargs)


# YAML 1.1 reads 1e-5 (no dot) as a string; numbers written that way are meant as floats
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_override(text: str) -> tuple[str, Override]:
    if "=" not in text:
        raise ConfigError(text, None, "an override of the form key=value (e.g. train.lr=1e-5)")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = load_yaml(raw) if raw.strip() != "" else None
    except YamlMeaningError as e:
        raise ConfigError(key, raw, f"a value that reads as written: {e}") from None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        value = float(value)
    return key, Override(raw, value)


def set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(key, value, "a key inside a section")
    node[parts[-1]] = value
