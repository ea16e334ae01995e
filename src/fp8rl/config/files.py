"""The files a config names, checked before anything is written: the tiny model's overrides
against the Qwen3 config, and a weights file read tensor by tensor."""

from __future__ import annotations

import torch

from ..errors import ConfigError


def check_tiny_overrides(tiny: dict, key: str) -> None:
    """Each model.tiny key is a field of the tiny Qwen3 config, with a value of its type."""
    from transformers import Qwen3Config

    from ..models.tiny import TINY_DEFAULTS

    base = Qwen3Config().to_dict()  # the fields (hasattr would admit its methods too)
    for name, value in tiny.items():
        where = f"{key}.{name}"
        if name == "vocab_size":
            raise ConfigError(where, value, "no value: the vocabulary is the task tokenizer's")
        if name not in TINY_DEFAULTS and name not in base:
            known = sorted(k for k in TINY_DEFAULTS if k != "vocab_size")
            raise ConfigError(where, value, f"a Qwen3Config field, e.g. one of {known}")
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


def check_weights_file(path: str, key: str) -> None:
    """A readable safetensors file whose tensors are all finite, checked one tensor at a time
    (memory stays at one tensor) before any run folder is made."""
    from pathlib import Path

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
