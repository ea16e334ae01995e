"""Config loading: YAML + overrides, and every bad value named with its key and range."""

from pathlib import Path

import pytest

from fp8rl.config import load_config, parse_override
from fp8rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_validate_and_overrides_apply():
    cfg = load_config(
        overrides=[
            "train.lr=1e-6",
            "loss.mode=dapo",
            "rollout.n=16",
            "model.tiny={hidden_size: 256}",
        ]
    )
    assert cfg.train.lr == 1e-6 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.n == 16
    assert cfg.model.tiny == {"hidden_size": 256}
    # dapo's defaults: clip-higher, token-mean, dynamic sampling
    assert cfg.loss.resolved_eps() == (0.2, 0.28)
    assert cfg.loss.resolved_agg() == "token-mean"
    assert cfg.loss.resolved_dynamic_sampling() is True
    grpo = load_config()
    assert (
        grpo.loss.resolved_eps() == (0.2, 0.2) and grpo.loss.resolved_agg() == "seq-mean-token-mean"
    )


@pytest.mark.parametrize(
    "override, key, hint",
    [
        ("train.lr=-1", "train.lr", "(0.0, 1.0]"),
        ("train.lr=abc", "train.lr", "a number"),
        ("loss.mode=ppo", "loss.mode", "calibrated"),
        ("rollout.precision=fp4", "rollout.precision", "fp8-blockwise"),
        ("train.precision=int8", "train.precision", "fp8-rowwise"),
        ("rollout.n=0", "rollout.n", "[1, 1024]"),
        ("rollout.top_p=1.5", "rollout.top_p", "(0.0, 1.0]"),
        ("rollout.temperature=0", "rollout.temperature", "(0.0, 10.0]"),
        ("loss.eps_low=1.5", "loss.eps_low", "(0.0, 1.0)"),
        ("loss.tis_level=batch", "loss.tis_level", "sequence"),
        ("loss.tis_cap=0.5", "loss.tis_cap", "[1.0"),
        ("calibration.interval=0", "calibration.interval", "[1,"),
        ("train.mini_batches=100000", "train.mini_batches", "batch size"),
        ("train.unknown=1", "train.unknown", "one of the keys"),
        ("nosection=1", "nosection", "one of the keys"),
        ("log.tensorboard=maybe", "log.tensorboard", "true or false"),
        ("model.source=/does/not/exist", "model.source", "checkpoint folder"),
        ("train.betas=[0.9]", "train.betas", "two numbers"),
    ],
)
def test_bad_values_name_key_and_allowed_range(override, key, hint):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert e.value.key == key
    assert key in str(e.value) and hint in str(e.value)


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.lr")


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


def test_shipped_configs_load(tmp_path):
    load_config(ROOT / "configs" / "arithmetic.yaml")
    # the GPU recipe points at a checkpoint the user supplies; any existing folder stands in
    cfg = load_config(ROOT / "configs" / "math-qwen3-8b.yaml", [f"model.source={tmp_path}"])
    assert cfg.train.lr == 1e-6 and cfg.loss.tis_cap == 2.0 and cfg.calibration.interval == 20
    assert cfg.loss.mode == "calibrated" and cfg.rollout.precision.startswith("fp8")


def test_fp8_finite_checks_reach_both_recipes(tmp_path):
    from fp8rl.config.precision import recipe_for

    cfg = load_config(ROOT / "configs" / "math-qwen3-8b.yaml", [f"model.source={tmp_path}"])
    assert cfg.train.fp8_check_finite is False  # the GPU recipe avoids a sync per quantization
    r = recipe_for(cfg.rollout.precision, cfg.train.fp8_check_finite)
    assert r.granularity == "blockwise" and r.check_finite is False
    assert recipe_for("fp8-rowwise").check_finite is True and recipe_for("bf16") is None


def test_real_model_config_validates(tmp_path):
    import json

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
