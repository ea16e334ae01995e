"""The files a config names, checked before anything is written: every path expanded as the
user means it, what the model starts from (a checkpoint folder, a warm start whose recorded
sha256 must match, a weights file read tensor by tensor), the tiny model's overrides, and the
FP8 run whose shadow statistics `loss.ratio_noise: {auto: RUN_DIR}` reads."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError
from ..rl.shadow import CORR_KEY, SD_KEY
from .warmstart_file import verified_sha256

if TYPE_CHECKING:
    from .sections import RunConfig


METRICS_FILE = "metrics.jsonl"  # the run log's, read by loss.ratio_noise.auto
_UNSET_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def _path(key: str, value):
    """A path as the user means it: `~` and environment variables expanded (YAML does
    neither), relative to the current directory. Empty or space-padded paths are refused:
    "" is the current directory, and "runs/a " a folder that lists like "runs/a"."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        raise ConfigError(key, value, "a non-empty path")
    if value != value.strip():
        raise ConfigError(key, value, "a path without leading or trailing spaces")
    out = os.path.expanduser(os.path.expandvars(value))
    unset = _UNSET_VAR.search(out)
    if unset:
        raise ConfigError(key, value, f"a path whose environment variables are set ({unset[0]})")
    return out


def expand_paths(cfg: RunConfig) -> None:
    """Every path of the config, expanded in place: the run, its saved config.json and the
    error messages all see the path used."""
    m = cfg.model
    cfg.log.out_dir = _path("log.out_dir", cfg.log.out_dir)
    if m.source != "tiny":
        m.source = _path("model.source", m.source)
    if m.init_weights is not None:
        m.init_weights = _path("model.init_weights", m.init_weights)
    if m.warm_start not in ("none", "auto"):
        m.warm_start = _path("model.warm_start", m.warm_start)
    rn = cfg.loss.ratio_noise
    if isinstance(rn, dict) and "auto" in rn:
        rn["auto"] = _path("loss.ratio_noise.auto", rn["auto"])
    for name, value in cfg.task.options.items():
        if name.endswith("_path"):  # the math task's train_path / test_path: a path or a list
            key = f"task.options.{name}"
            many = isinstance(value, list)
            paths = [_path(f"{key}[{i}]", v) for i, v in enumerate(value)] if many else None
            cfg.task.options[name] = paths if many else _path(key, value)


def check_model_files(m) -> None:
    """What the model starts from exists and reads as it should (the filesystem, last)."""
    if m.source != "tiny" and not Path(m.source).exists():
        raise ConfigError("model.source", m.source, "'tiny' or an existing local checkpoint folder")
    if m.tiny:
        check_tiny_overrides(m.tiny, "model.tiny")
    if m.warm_start not in ("none", "auto"):
        if not Path(m.warm_start).is_file():
            raise ConfigError(
                "model.warm_start", m.warm_start, "'none', 'auto' or an existing .safetensors file"
            )
        check_weights_file(m.warm_start, "model.warm_start")
        verified_sha256(m.warm_start)
    if m.init_weights is not None:
        check_weights_file(m.init_weights, "model.init_weights")


def check_tiny_overrides(tiny: dict, key: str) -> None:
    """model.tiny.model_type is a supported family; each other key is a field of that family's
    config class, with a value of its type."""
    from ..models.tiny import DEFAULT_FAMILY, FAMILIES, TINY_DEFAULTS, config_fields

    family = tiny.get("model_type", DEFAULT_FAMILY)
    if family not in FAMILIES:
        raise ConfigError(f"{key}.model_type", family, f"one of {', '.join(FAMILIES)}")
    base = config_fields(family)  # the fields (hasattr would admit its methods too)
    for name, value in tiny.items():
        where = f"{key}.{name}"
        if name == "model_type":
            continue
        if name == "vocab_size":
            raise ConfigError(where, value, "no value: the vocabulary is the task tokenizer's")
        if name not in TINY_DEFAULTS and name not in base:
            known = sorted(k for k in TINY_DEFAULTS if k != "vocab_size")
            cls = _config_class(family)
            raise ConfigError(where, value, f"a {cls} field, e.g. one of {known}")
        default = TINY_DEFAULTS.get(name, base.get(name))
        # sizes and counts (the tiny defaults) are >= 1; other integer fields >= 0
        least = 1 if name in TINY_DEFAULTS else 0
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(where, value, "true or false")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(where, value, f"an integer >= {least}")
        elif isinstance(default, float):
            ok = not isinstance(value, bool) and isinstance(value, (int, float))
            if not ok or not (value > 0 if least else value >= 0) or value == float("inf"):
                raise ConfigError(where, value, "a finite number > 0" if least else "a number >= 0")


def _config_class(family: str) -> str:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[family].__name__


def check_weights_file(path: str, key: str) -> None:
    """A readable safetensors file whose tensors are all finite, checked one tensor at a time
    (memory stays at one tensor) before any run folder is made."""
    from safetensors import SafetensorError, safe_open

    from ..errors import CheckpointError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(key, path, "an existing .safetensors file")
    try:
        with safe_open(str(p), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise CheckpointError(f"{key}: {p}: tensor {name!r} holds inf or nan values")
    except SafetensorError as e:
        raise CheckpointError(f"{key}: {p} is not a readable safetensors file ({e})") from e


def read_noise_calibration(
    run_dir, *, min_step: int = 1, key: str = "loss.ratio_noise.auto"
) -> tuple[float, float]:
    """(S, C) for `auto: RUN_DIR`: the means over the steps >= min_step of RUN_DIR/metrics.jsonl
    whose rows hold finite shadow/logprob_err_sd and shadow/old_new_err_corr (step 0 is left
    out by default: its passes run before any update, so their errors are not yet typical).
    Each mean is over the rows that hold both. A ConfigError under `key` names the file when
    it is missing or has no such rows. Unreadable lines are skipped: a crash can cut the last."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise ConfigError(key, str(run_dir), f"a run folder with {METRICS_FILE} ({path} not found)")
    sds, corrs = [], []
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("step"), int)
                or row["step"] < min_step
            ):
                continue
            s, c = row.get(SD_KEY), row.get(CORR_KEY)
            if _finite(s) and _finite(c):
                sds.append(float(s))
                corrs.append(float(c))
    if not sds:
        raise ConfigError(
            key,
            str(run_dir),
            f"a run whose {path} has {SD_KEY} and {CORR_KEY} at steps >= {min_step} "
            "(an FP8 run with shadow passes)",
        )
    return sum(sds) / len(sds), sum(corrs) / len(corrs)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
