"""config/load.py: a RunConfig from a YAML file and `key=value` overrides, then validated; a
missing or unreadable file is one line naming --config; the shipped configs load."""

import json
from pathlib import Path

import pytest

from fp8rl.config import load_config
from fp8rl.errors import ConfigError
from helpers_config import refused_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_yaml_file_and_missing_file(tmp_path):
    p = tmp_path / "c.yaml"
    # "1e-3" without a dot is a string to YAML 1.1; a float field still reads it as a number
    p.write_text("train:\n  lr: 1e-3\n  steps: 7\nloss:\n  mode: calibrated\n")
    cfg = load_config(p, ["train.steps=9"])
    assert cfg.train.lr == 1e-3 and cfg.train.steps == 9 and cfg.loss.mode == "calibrated"
    assert cfg.shadow_passes
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="valid YAML"):
        load_config(bad)


def test_a_tab_indent_is_a_one_line_error_naming_the_line(tmp_path):
    message = refused_yaml(tmp_path, "train:\n\tlr: 0.1\n")
    for needle in ("valid YAML", "'\\t'", "line 2"):
        assert needle in message, (needle, message)


def test_shipped_configs_load(tmp_path):
    load_config(ROOT / "configs" / "arithmetic.yaml")
    # the GPU recipe points at a checkpoint the user supplies; any existing folder stands in
    cfg = load_config(ROOT / "configs" / "math-qwen3-8b.yaml", [f"model.source={tmp_path}"])
    assert cfg.train.lr == 1e-6 and cfg.loss.tis_cap == 2.0 and cfg.calibration.interval == 20
    assert cfg.loss.mode == "calibrated" and cfg.rollout.precision.startswith("fp8")


def test_real_model_config_validates(tmp_path):
    from fp8rl.tasks import get_task

    # the converted SmolLM2-135M-Instruct's config.json shape stands in for the folder
    folder = tmp_path / "smollm2"
    folder.mkdir()
    shape = dict(model_type="llama", hidden_size=576, intermediate_size=1536, head_dim=64)
    heads = dict(num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30)
    (folder / "config.json").write_text(json.dumps({**shape, **heads, "vocab_size": 49152}))
    cfg = load_config(ROOT / "configs" / "real-model.yaml", [f"model.source={folder}"])
    assert (cfg.task.name, cfg.task.chat, cfg.rollout.precision, cfg.train.precision) == (
        "arithmetic_qa",
        True,
        "fp8-rowwise",
        "fp8-rowwise",
    )
    assert cfg.loss.mode == "calibrated" and cfg.model.dtype == "float32"
    assert (cfg.rollout.prompts_per_step, cfg.rollout.n, cfg.rollout.max_new_tokens) == (8, 4, 48)
    task = get_task(cfg.task.name, **cfg.task.options)
    assert len(task.samples("test")) >= cfg.log.eval_size
