"""`model.keep_high_precision` (issue 43): bad values are one-line errors naming the key, before
anything is written; a run converts what it says, lists it in fp8_conversion.txt, and final.json
records the choice and the FP8 coverage."""

import json

import pytest
import torch
import yaml

from fp8rl.config import config_from_dict
from fp8rl.config.keep_precision import check_model
from fp8rl.errors import ConfigError
from fp8rl.models import tiny_qwen3
from helpers_config import TINY, tiny_config

KEY = "model.keep_high_precision"


def _with(tmp_path, **keep) -> dict:
    return tiny_config(tmp_path / "run", model={"keep_high_precision": keep})


@pytest.mark.parametrize(
    "keep, needle",
    [
        ({"first_blocks": -1}, f"'{KEY}.first_blocks' = -1 is invalid: expected a value in [0,"),
        ({"last_blocks": "two"}, f"'{KEY}.last_blocks' = 'two' is invalid: expected an integer"),
        ({"modules": "*.o_proj"}, f"'{KEY}.modules' = '*.o_proj' is invalid: expected a list"),
        ({"modules": ["*.o_proj", ""]}, f"'{KEY}.modules' = ['*.o_proj', ''] is invalid"),
        ({"lm_head": "no"}, f"'{KEY}.lm_head' = 'no' is invalid: expected true or false"),
        ({"blocks": 2}, f"'{KEY}.blocks' = 2 is invalid: expected one of the keys"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(tmp_path, keep, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(_with(tmp_path, **keep))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def _model_error(tmp_path, **keep) -> str:
    cfg = config_from_dict(_with(tmp_path, **keep))
    model = tiny_qwen3(vocab_size=21, **TINY)  # the arithmetic task's 21 characters
    with pytest.raises(ConfigError) as e:
        check_model(model, cfg, torch.device("cpu"))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_what_the_built_model_cannot_honour_names_the_key(tmp_path):
    msg = _model_error(tmp_path, first_blocks=3)
    assert f"'{KEY}.first_blocks' = 3" in msg and "at most the model's 2 decoder blocks" in msg
    msg = _model_error(tmp_path, modules=["*.mlp.*", "*.qkv_proj"])
    assert f"'{KEY}.modules' = '*.qkv_proj'" in msg and "a pattern matching" in msg, msg
    # vocabulary 21 is no multiple of 16: the lm_head cannot be quantized as asked
    msg = _model_error(tmp_path, lm_head=False)
    assert f"'{KEY}.lm_head' = False" in msg and "lm_head (128 -> 21)" in msg, msg


def test_vllm_s_own_fp8_cannot_keep_layers_so_it_is_refused(tmp_path):
    cfg = config_from_dict(_with(tmp_path, down_proj=True))
    cfg.rollout.engine = "vllm"  # (validating it would import vLLM)
    model = tiny_qwen3(vocab_size=21, **TINY)
    with pytest.raises(ConfigError, match="the default with rollout.engine=vllm"):
        check_model(model, cfg, torch.device("cuda"))
    check_model(model, cfg, torch.device("cpu"))  # fake-quantized pushes keep them


def test_high_precision_runs_keep_everything_anyway(tmp_path):
    data = _with(tmp_path, first_blocks=9)
    data["rollout"]["precision"] = data["train"]["precision"] = "bf16"
    check_model(tiny_qwen3(vocab_size=21, **TINY), config_from_dict(data), torch.device("cpu"))


def test_the_cli_refuses_before_writing_anything(tmp_path, monkeypatch, capsys):
    from fp8rl.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / "run")))
    argv = ["train", "--config", str(path), "--no-progress", f"{KEY}.last_blocks=5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"'{KEY}.last_blocks' = 5" in err and not (tmp_path / "run").exists(), err


def test_final_json_and_the_conversion_report_record_the_choice(tmp_path, capsys):
    from fp8rl.cli import main

    data = _with(tmp_path, first_blocks=1, modules=["model.layers.1.mlp.down_proj"])
    data["train"]["steps"], data["log"]["eval_size"] = 1, 0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["train", "--config", str(path), "--no-progress"]) == 0
    final = json.loads((tmp_path / "run" / "final.json").read_text())
    # TINY: per block q, k, v, o 128 x 128 = 16384 each and gate, up, down 128 x 256 = 32768
    # each: 163840; lm_head 128 x 21 = 2688. In FP8: block 1 but its down_proj.
    assert final["fp8_coverage"] == pytest.approx((163840 - 32768) / (2 * 163840 + 2688))
    assert final["fp8_keep_high_precision"] == {
        "lm_head": True,
        "first_blocks": 1,
        "last_blocks": 0,
        "down_proj": False,
        "modules": ["model.layers.1.mlp.down_proj"],
    }
    assert (final["fp8_layers_converted"], final["fp8_layers_kept"]) == (6, 9)
    text = (tmp_path / "run" / "fp8_conversion.txt").read_text(encoding="utf-8")
    assert "FP8 coverage: 39.67 %" in text, text
    assert "kept       model.layers.0.mlp.up_proj (128 -> 256): block 0 of 2" in text
    assert "kept       model.layers.1.mlp.down_proj (256 -> 128): matches" in text
