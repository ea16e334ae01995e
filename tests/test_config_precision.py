"""config/precision.py: the config's precision names to quantization recipes."""

from pathlib import Path

from fp8rl.config import load_config
from fp8rl.config.precision import recipe_for

ROOT = Path(__file__).resolve().parents[1]


def test_fp8_finite_checks_reach_both_recipes(tmp_path):
    cfg = load_config(ROOT / "configs" / "math-qwen3-8b.yaml", [f"model.source={tmp_path}"])
    assert cfg.train.fp8_check_finite is False  # the GPU recipe avoids a sync per quantization
    r = recipe_for(cfg.rollout.precision, cfg.train.fp8_check_finite)
    assert r.granularity == "blockwise" and r.check_finite is False
    assert recipe_for("fp8-rowwise").check_finite is True and recipe_for("bf16") is None
