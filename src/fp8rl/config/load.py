"""A RunConfig from a YAML file, a base mapping and `key=value` overrides, then validated."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError, os_errors
from .coerce import _build, parse_override, set_dotted
from .sections import RunConfig
from .validate import validate
from .yaml_strict import load_yaml


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple = (), base: dict | None = None
) -> RunConfig:
    """YAML file (optional) < base dict < `key=value` overrides, then validated."""
    data: dict = {}
    if base:
        data = merge(data, base)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("--config", str(path), "an existing YAML file")
        try:
            with os_errors("read config file", p):
                loaded = load_yaml(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            line = p.read_bytes()[: e.start].count(b"\n") + 1
            raise ConfigError(
                "--config", str(path), f"UTF-8 text (a bad byte on line {line})"
            ) from e
        except yaml.YAMLError as e:
            raise ConfigError("--config", str(path), f"valid YAML ({_one_line(e)})") from e
        if not isinstance(loaded, dict):
            # an empty file would silently run every default; a list or a string is no config
            found = "an empty file" if loaded is None else f"a YAML {type(loaded).__name__}"
            raise ConfigError(
                "--config",
                str(path),
                f"a mapping of sections (model, task, rollout, train, ...), found {found}",
            )
        data = merge(data, loaded)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(data, key, value)
    return validate(_build(RunConfig, data, ""))


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def merge(a: dict, b: dict) -> dict:
    """b over a, mappings merged key by key (a spec's base under its arms' settings)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_from_dict(data: dict) -> RunConfig:
    return validate(_build(RunConfig, data, ""))
