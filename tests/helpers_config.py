"""Configs of tiny runs: the 2-step fp8-rowwise GRPO run most tests start from, its
warm-start variant and a sweep spec of such runs.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import json

import pytest

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}


def tiny_config(out_dir, **sections) -> dict:
    """The config data of a tiny 2-step fp8-rowwise GRPO run on one-digit addition; each
    keyword updates that section (a dict is merged into it, anything else replaces it)."""
    data = {
        "name": "t",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 64, "test_size": 16},
        },
        "model": {"source": "tiny", "tiny": dict(TINY)},
        "rollout": {"precision": "fp8-rowwise", "prompts_per_step": 4, "n": 4, "max_new_tokens": 4},
        "train": {"precision": "fp8-rowwise", "steps": 2, "lr": 1e-3, "mini_batches": 2},
        "loss": {"mode": "grpo"},
        "calibration": {"interval": 1, "min_tokens": 2},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 0, "eval_size": 8, "progress": False},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return data


def tiny_config_file(tmp_path, **sections):
    """tiny_config written to tmp_path/cfg.json, its run folder tmp_path/run."""
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(tiny_config(tmp_path / "run", **sections)))
    return path


FAST_WARM_START = {
    "steps": 20,
    "batch_size": 16,
    "lr": 5e-3,
    "target_accuracy": 1.0,
    "check_every": 10,
}


def warm_start_config(tmp_path, **sections):
    """The tiny run's config with `model.warm_start: auto` and a short warm start."""
    from fp8rl.config import config_from_dict

    model = {**tiny_config(tmp_path)["model"], "warm_start": "auto", **sections.pop("model", {})}
    return config_from_dict(
        tiny_config(
            tmp_path,
            model=model,
            warm_start={**FAST_WARM_START, **sections.pop("warm_start", {})},
            **sections,
        )
    )


def sweep_spec(tmp_path, weights=None, **top) -> dict:
    """A 2-arm (bf16, fp8) x 2-seed sweep spec of 3-step tiny runs; `top` updates it."""
    base = tiny_config(tmp_path / "unused", train={"steps": 3})
    if weights:
        base["model"]["init_weights"] = str(weights)
    spec = {
        "base": base,
        "arms": {
            "bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
            "fp8": {"calibration": {"diagnostics": True}},
        },
        "seeds": [0, 1],
    }
    spec.update(top)
    return spec


# ---------------------------------------------------------------- refused configs


def refused(*overrides, path=None):
    """The ConfigError `load_config` raises for the YAML file `path` (None: the defaults) and
    the `key=value` overrides; a config that loads fails the test."""
    from fp8rl.config import load_config
    from fp8rl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    return e.value


def refused_yaml(tmp_path, text: str) -> str:
    """The one-line message `load_config` refuses the YAML `text` with (tmp_path/c.yaml)."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    message = str(refused(path=path))
    assert "\n" not in message, message
    return message


def assert_refused(override: str, key: str, needles=()) -> None:
    """`load_config` refuses the `override` naming the dotted `key` (its key, and in its
    text) and saying every needle."""
    error = refused(override)
    assert error.key == key and key in str(error), (key, error.key, str(error))
    for needle in needles:
        assert needle in str(error), (needle, str(error))
