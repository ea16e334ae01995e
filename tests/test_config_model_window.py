"""The model refusals of config/model_window.py (and model.tiny.model_type): one line naming
the key, before any run folder is written; the rollout's own guard on each batch."""

import json

import pytest

from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from fp8rl.models import FAMILIES, tiny_model
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config

pytestmark = pytest.mark.families

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "head_dim": 16}


def refused(data) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert "\n" not in str(e.value)
    return e.value


def test_an_unknown_family_names_the_key_and_the_allowed_ones(tmp_path):
    e = refused(tiny_config(tmp_path, model={"tiny": {"model_type": "gpt2"}}))
    assert e.key == "model.tiny.model_type" and e.value == "gpt2"
    assert all(f in e.allowed for f in FAMILIES)


def test_a_field_of_another_family_is_refused_naming_the_config_class(tmp_path):
    e = refused(tiny_config(tmp_path, model={"tiny": {"model_type": "llama", "num_experts": 4}}))
    assert e.key == "model.tiny.num_experts" and "LlamaConfig" in e.allowed


def test_every_family_passes_validation(tmp_path):
    for family in FAMILIES:
        cfg = config_from_dict(tiny_config(tmp_path, model={"tiny": {"model_type": family}}))
        assert cfg.model.tiny["model_type"] == family


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_gemma_2_and_3_are_refused_from_the_checkpoints_config(tmp_path, model_type):
    from transformers import CONFIG_MAPPING

    folder = tmp_path / "ckpt"
    CONFIG_MAPPING[model_type]().save_pretrained(folder)
    e = refused(tiny_config(tmp_path, model={"source": str(folder), "tiny": {}}))
    assert e.key == "model.source" and repr(model_type) in e.allowed
    assert "sliding-window" in e.allowed


def test_a_window_shorter_than_max_new_tokens_is_refused_from_the_config(tmp_path):
    data = tiny_config(
        tmp_path,
        model={"tiny": {"model_type": "mistral", "sliding_window": 4, **SMALL}},
        rollout={"max_new_tokens": 4},
    )
    e = refused(data)
    assert e.key == "model.tiny.sliding_window" and e.value == 4
    assert "rollout.max_new_tokens (4) = 5" in e.allowed


def test_qwen2_window_layers_are_refused_too(tmp_path):
    tiny = {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 3, **SMALL}
    tiny["max_window_layers"] = 0  # every layer slides
    e = refused(tiny_config(tmp_path, model={"tiny": tiny}))
    assert e.key == "model.tiny.sliding_window" and e.value == 3


def test_a_window_shorter_than_the_longest_prompt_is_refused_before_the_run_folder(tmp_path):
    # one-digit addition prompts are about 5 characters: 8 - 4 new tokens is too short
    tiny = {"model_type": "mistral", "sliding_window": 8, **SMALL}
    cfg = config_from_dict(tiny_config(tmp_path / "run", model={"tiny": tiny}))
    with pytest.raises(ConfigError) as e:
        Trainer(cfg)
    assert e.value.key == "model.tiny.sliding_window" and "longest prompt" in e.value.allowed
    assert not (tmp_path / "run").exists()
    tiny["sliding_window"] = 64
    Trainer(config_from_dict(tiny_config(tmp_path / "run", model={"tiny": tiny})))


def test_the_engine_refuses_a_batch_longer_than_the_window():
    model = tiny_model("mistral", vocab_size=32, sliding_window=6, **SMALL)
    engine = RolloutEngine(model, decode="eager")
    params = SamplingParams(n=1, max_new_tokens=3, temperature=1.0)
    assert engine.generate([[1, 2, 3]], params).response_ids.shape[1] <= 3  # 3 + 3 fits
    with pytest.raises(ValueError, match="sliding_window = 6 is shorter than the sequence"):
        engine.generate([[1, 2, 3, 4]], params)


def test_a_checkpoint_window_names_config_json(tmp_path):
    folder = tmp_path / "ckpt"
    tiny_model("mistral", vocab_size=32, sliding_window=4, **SMALL).save_pretrained(folder)
    e = refused(tiny_config(tmp_path, model={"source": str(folder), "tiny": {}}))
    assert e.key == "model.source" and "config.json's sliding_window (4)" in e.allowed
    assert json.loads((folder / "config.json").read_text())["sliding_window"] == 4


def test_moe_experts_that_would_stay_in_high_precision_are_refused(tmp_path):
    tiny = {"model_type": "qwen3_moe", "moe_intermediate_size": 40, **SMALL}
    e = refused(tiny_config(tmp_path, model={"tiny": tiny}))
    assert e.key == "model.tiny.moe_intermediate_size" and e.value == 40
    assert "a multiple of 16" in e.allowed
    tiny["moe_intermediate_size"] = 48
    assert config_from_dict(tiny_config(tmp_path, model={"tiny": tiny}))
