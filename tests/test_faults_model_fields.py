"""Every `model.tiny` value either validates and builds a model that runs, or is a one-line
ConfigError naming its `model.tiny.*` key at validation, before any run folder: fp8rl's own
rules (hidden_act, attention_dropout, heads divisible by KV heads, an even head_dim) and
transformers' validation of the config. A model too short for the task's prompts plus
rollout.max_new_tokens is refused before the warm start and the run folder."""

from __future__ import annotations

import json

import pytest
import torch

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from fp8rl.models.tiny import TINY_DEFAULTS, tiny_qwen3
from helpers_config import TINY, tiny_config
from helpers_runs import one_error_line

# the trial's cases: each was a traceback, some after the run folder existed
CASES = [
    ({"hidden_act": "swishy"}, "model.tiny.hidden_act", "ACT2FN"),
    ({"hidden_act": 5}, "model.tiny.hidden_act", "ACT2FN"),
    ({"attention_dropout": 1.0}, "model.tiny.attention_dropout", "[0, 1)"),
    ({"head_dim": 33}, "model.tiny.head_dim", "even"),
    ({"num_attention_heads": 6}, "model.tiny.num_attention_heads", "divisible"),
    ({"num_key_value_heads": 3}, "model.tiny.num_key_value_heads", "divisible"),
]


def _validate(tiny: dict, **sections):
    return config_from_dict(tiny_config("/nonexistent/run", model={"tiny": tiny}, **sections))


@pytest.mark.parametrize(
    "tiny,key,says",
    CASES,
    ids=[next(iter(c[0])) + "-" + str(next(iter(c[0].values()))) for c in CASES],
)
def test_each_bad_model_field_is_a_config_error_naming_it(tiny, key, says):
    with pytest.raises(ConfigError) as e:
        _validate({**TINY, **tiny})
    assert e.value.key == key and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_a_bad_model_field_before_writing_anything(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_config(run)))
    assert main(["train", "--config", str(cfg), "model.tiny.head_dim=33"]) == 2
    one_error_line(capsys, "model.tiny.head_dim")
    assert not run.exists()


# a value of each kind for every field: wrong types, out-of-range numbers, odd containers
VALUES = [-1, 0, 1, 3, 0.5, 1.5, float("nan"), "x", True, None, [1], {"a": 1}]
# sliding-window fields are the real-model issue's (its own refusals); the rest are here
FIELDS = sorted(
    {
        *TINY_DEFAULTS,
        "hidden_act",
        "attention_dropout",
        "initializer_range",
        "attention_bias",
        "use_cache",
        "rms_norm_eps",
        "chunk_size_feed_forward",
        "output_attentions",
    }
    - {"vocab_size"}
)


@pytest.mark.parametrize("name", FIELDS)
def test_every_value_of_a_field_validates_and_runs_or_is_refused_naming_it(name):
    """The class, not the examples: a value validation lets through builds a model whose
    forward runs on a prompt; any other is a ConfigError naming the field."""
    ran = refused = 0
    for value in VALUES:
        try:
            cfg = _validate({**TINY, name: value})
        except ConfigError as e:
            assert e.key.startswith(f"model.tiny.{name}") or e.key == "model.tiny", (value, e)
            refused += 1
            continue
        model = tiny_qwen3(vocab_size=16, **cfg.model.tiny)
        logits = model(input_ids=torch.arange(8).view(1, 8)).logits
        assert logits.shape == (1, 8, 16), (name, value)
        ran += 1
    assert refused > 0  # every field has values that must be refused (a string at least)


def test_a_model_too_short_for_prompt_and_answer_is_refused_before_the_run_folder(tmp_path, capsys):
    """Was: validation passed, the warm start and the folder were made, then the first
    rollout raised 'exceeds the model's max_position_embeddings' as a traceback."""
    run = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_config(run, rollout={"max_new_tokens": 8})))
    assert main(["train", "--config", str(cfg), "model.tiny.max_position_embeddings=12"]) == 2
    line = one_error_line(capsys, "model.tiny.max_position_embeddings' = 12")
    assert "plus rollout.max_new_tokens (8)" in line
    assert not run.exists()
