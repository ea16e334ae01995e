"""The block-scaled recipes end to end on the CPU: `fp8rl train` and `fp8rl sweep` with
train.precision and rollout.precision nvfp4 / mxfp8 / mxfp4 on a tiny Qwen3."""

import json
import math

import pytest
import yaml

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from helpers_config import tiny_config

BLOCK_SCALED = ("nvfp4", "mxfp8", "mxfp4")


@pytest.mark.parametrize("precision", BLOCK_SCALED)
def test_fp8rl_train_runs_each_block_scaled_recipe(tmp_path, precision):
    out = tmp_path / "run"
    data = tiny_config(
        out,
        rollout={"precision": precision},
        train={"precision": precision, "steps": 2},
        loss={"mode": "calibrated"},
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["train", "--config", str(path)]) == 0
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:  # the shadow passes compared this recipe's log-probs with high precision
        assert math.isfinite(r["shadow/nmae_prob"]) and r["shadow/nmae_prob"] > 0
        assert math.isfinite(r["actor/loss"])
    conversion = (out / "fp8_conversion.txt").read_text()
    assert conversion.startswith(f"FP8 conversion ({precision})")
    hp = "high precision (float32) on the dequantized forward operands"
    assert (hp in conversion) == (precision != "mxfp8")


def test_ratio_noise_is_refused_in_a_block_scaled_run(tmp_path):
    data = tiny_config(
        tmp_path, train={"precision": "nvfp4"}, loss={"ratio_noise": {"sd": 0.1, "corr": 0.0}}
    )
    with pytest.raises(ConfigError, match="loss.ratio_noise.*null in a quantized run"):
        config_from_dict(data)
    with pytest.raises(ConfigError, match=r"train.precision.*'nvfp4'"):
        config_from_dict(tiny_config(tmp_path, train={"precision": "fp4"}))


def test_fp8rl_sweep_runs_block_scaled_arms(tmp_path, capsys):
    base = tiny_config(tmp_path / "unused", train={"steps": 2})
    base["calibration"]["diagnostics"] = True
    arms = {p: {"rollout": {"precision": p}, "train": {"precision": p}} for p in BLOCK_SCALED}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": base, "arms": arms, "seeds": [0]}))
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress", "--jobs", "1"]) == 0
    agg = json.loads((out / "aggregate.json").read_text())
    for p in BLOCK_SCALED:
        done = json.loads((out / p / "seed-0" / "done.json").read_text())
        assert done["steps"] == 2
        cfg = json.loads((out / p / "seed-0" / "config.json").read_text())
        assert cfg["train"]["precision"] == cfg["rollout"]["precision"] == p
        assert "shadow/nmae_prob" in agg["arms"][p]["metrics"]
    assert f"| {BLOCK_SCALED[0]} | 1 |" in capsys.readouterr().out
