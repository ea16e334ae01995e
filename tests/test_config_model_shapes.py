"""config/model_shapes.py: the model's shape and `model.tiny` fields, checked before anything
is written.

Issue 35, point 2: a model shape the precision recipe cannot quantize is refused at
validation, in one line naming the `model.*` key, the recipe and its alignment, before anything
is written. It used to pass validation, then either keep projections in high precision without
a word (a run labelled nvfp4 that was not one) or end in a RolloutEngine traceback naming the
rollout's recipe even when the trainer's decided. See docs/reliability.md, "Bad input".

Every `model.tiny` value either validates and builds a model that runs, or is a one-line
ConfigError naming its `model.tiny.*` key at validation, before any run folder: fp8rl's own
rules (hidden_act, attention_dropout, heads divisible by KV heads, an even head_dim) and
transformers' validation of the config. A model too short for the task's prompts plus
rollout.max_new_tokens is refused before the warm start and the run folder.
"""

import json
from pathlib import Path

import pytest
import torch
import yaml

from fp8rl.cli import main
from fp8rl.config import config_from_dict, load_config
from fp8rl.config.precision import RECIPE_OF_PRECISION, prepare_model
from fp8rl.errors import ConfigError
from fp8rl.fp8 import Fp8Recipe
from fp8rl.models.tiny import TINY_DEFAULTS, tiny_qwen3
from helpers_config import TINY, tiny_config
from helpers_runs import one_error_line

ROOT = Path(__file__).resolve().parents[1]
# precision -> (its alignment, a hidden_size it converts, one a smaller alignment would)
SHAPES = {
    "fp8-tensorwise": (16, 48, 40),
    "fp8-rowwise": (16, 48, 40),
    "fp8-blockwise": (16, 48, 40),  # ragged 128-blocks are fine (issue 43)
    "mxfp8": (32, 64, 48),
    "mxfp4": (32, 64, 48),
    "nvfp4": (32, 64, 48),  # blocks of 16, but the kernels pack K in 32s
}
PHASES = ("rollout", "train")
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _cfg(tmp_path, precision: str, phase: str, **tiny):
    """The other phase in high precision, so that this phase's recipe alone decides."""
    other = "train" if phase == "rollout" else "rollout"
    return tiny_config(
        tmp_path / "run",
        model={"source": "tiny", "tiny": {"num_hidden_layers": 1, **tiny}},
        **{phase: {"precision": precision}, other: {"precision": "bf16"}},
    )


def _error(data) -> str:
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def _kept_projections(data) -> set[str]:
    """What convert_to_fp8 really keeps in high precision for this config's shape."""
    from fp8rl.models import tiny_qwen3

    tiny = data["model"]["tiny"]
    report = prepare_model(
        tiny_qwen3(**tiny), data["rollout"]["precision"], data["train"]["precision"]
    )
    return {name.rsplit(".", 1)[-1] for name in report.skipped}


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("precision", list(SHAPES))
def test_an_aligned_shape_validates_and_converts_every_projection(tmp_path, precision, phase):
    align, good, _ = SHAPES[precision]
    assert Fp8Recipe.from_name(RECIPE_OF_PRECISION[precision]).alignment == align
    data = _cfg(tmp_path, precision, phase, hidden_size=good, intermediate_size=2 * good)
    config_from_dict(data)
    assert _kept_projections(data) == {"lm_head"}  # kept on purpose, whatever the shape


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("precision", list(SHAPES))
def test_a_hidden_size_the_recipe_cannot_convert_is_a_one_line_error(tmp_path, precision, phase):
    align, _, bad = SHAPES[precision]
    data = _cfg(tmp_path, precision, phase, hidden_size=bad, intermediate_size=2 * align)
    message = _error(data)
    assert "'model.tiny.hidden_size' = " + str(bad) in message, message
    assert f"a multiple of {align}" in message and f"{phase}.precision={precision}" in message
    assert "every projection would stay in high precision" in message, message
    assert _kept_projections(data) == PROJECTIONS | {"lm_head"}  # the error tells the truth


def test_an_intermediate_size_nvfp4_cannot_take_is_refused_not_run_as_bf16_mlp(tmp_path):
    data = _cfg(tmp_path, "nvfp4", "train", hidden_size=128, intermediate_size=200)
    message = _error(data)
    assert "'model.tiny.intermediate_size' = 200" in message and "a multiple of 32" in message
    assert "recipe nvfp4" in message and "gate_proj, up_proj, down_proj would stay" in message
    assert _kept_projections(data) == {"gate_proj", "up_proj", "down_proj", "lm_head"}


@pytest.mark.parametrize(
    "tiny, key, needle",
    [
        ({"num_key_value_heads": 1, "head_dim": 8}, "head_dim' = 8", "(1 x 8 = 8)"),
        ({"head_dim": 6}, "head_dim' = 6", "(4 x 6 = 24)"),
    ],
)
def test_a_head_product_names_the_field_the_config_sets(tmp_path, tiny, key, needle):
    # (the tiny default head_dim 32 makes any head count a multiple of every alignment)
    data = _cfg(tmp_path, "fp8-blockwise", "train", hidden_size=128, **tiny)
    message = _error(data)
    assert f"'model.tiny.{key}" in message and needle in message, message
    assert "a multiple of 16" in message


def test_mixed_phases_name_the_recipe_the_model_is_converted_against(tmp_path):
    # was: a RolloutEngine traceback naming rowwise, which would have converted every layer
    data = tiny_config(
        tmp_path / "run",
        model={"tiny": {"hidden_size": 48, "intermediate_size": 128}},
        rollout={"precision": "fp8-rowwise"},
        train={"precision": "mxfp8"},
    )
    message = _error(data)
    assert "recipe mxfp8 (train.precision=mxfp8)" in message, message
    assert "rowwise" not in message


def test_high_precision_runs_take_any_shape(tmp_path):
    data = _cfg(tmp_path, "bf16", "train", hidden_size=40, intermediate_size=72)
    config_from_dict(data)


def _checkpoint(folder: Path, **fields) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}
SMOLLM2 = {  # SmolLM2-135M-Instruct's shape (docs/real-model.md, "The model")
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
}


def test_a_checkpoint_config_json_is_checked_at_validation(tmp_path):
    # Llama leaves head_dim (hidden / heads) and num_key_value_heads (heads) out
    source = _checkpoint(tmp_path / "ck", **LLAMA, intermediate_size=11000)
    data = tiny_config(tmp_path / "run", model={"source": str(source)})
    data["rollout"]["precision"] = data["train"]["precision"] = "mxfp8"
    message = _error(data)
    assert f"'model.source' = '{source}'" in message, message
    assert "config.json's intermediate_size (11000)" in message and "a multiple of 32" in message
    data["model"]["source"] = str(_checkpoint(tmp_path / "ok", **LLAMA, intermediate_size=11008))
    config_from_dict(data)


def test_a_checkpoint_validation_cannot_read_is_left_to_the_build(tmp_path):
    bare = tmp_path / "bare"  # no config.json: the loader's own error says so
    bare.mkdir()
    other = _checkpoint(tmp_path / "phi", model_type="phi3", hidden_size=48)
    for source in (bare, other):
        config_from_dict(tiny_config(tmp_path / "run", model={"source": str(source)}))


def _cli_error(tmp_path, monkeypatch, capsys, argv) -> str:
    """The one stderr line of `fp8rl train ARGV`, which must write nothing."""
    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert main(["train", "--out", "runs/x", "--no-progress", *argv]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fp8rl train")]
    assert len(lines) == 1 and lines[0].startswith("fp8rl train: error: config key"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return lines[0]


def test_the_cli_refuses_a_bad_shape_before_writing_anything(tmp_path, monkeypatch, capsys):
    argv = ["model.tiny.hidden_size=48", "rollout.precision=mxfp8", "train.precision=mxfp8"]
    line = _cli_error(tmp_path, monkeypatch, capsys, argv)
    assert "model.tiny.hidden_size" in line and "recipe mxfp8" in line and "32" in line


def test_an_architecture_validation_cannot_read_is_checked_once_built(
    tmp_path, monkeypatch, capsys
):
    from transformers import Phi3Config, Phi3ForCausalLM

    from fp8rl.tasks import char_tokenizer

    tok = char_tokenizer()
    shape = dict(hidden_size=48, intermediate_size=96, num_attention_heads=4, pad_token_id=0)
    model = Phi3ForCausalLM(Phi3Config(vocab_size=len(tok), num_hidden_layers=1, **shape))
    model.save_pretrained(tmp_path / "phi")  # fused qkv_proj and gate_up_proj
    tok.save_pretrained(tmp_path / "phi")
    argv = ["model.source=phi", "rollout.precision=mxfp8", "train.precision=mxfp8"]
    line = _cli_error(tmp_path, monkeypatch, capsys, argv)
    assert "'model.source' = 'phi'" in line and "multiples of 32" in line, line
    assert "none is (e.g. model.layers.0.self_attn.o_proj (48 -> 48))" in line


def test_a_partly_convertible_architecture_gets_a_warning_with_the_count(tmp_path):
    import torch.nn as nn

    from fp8rl.config.model_shapes import check_built_model

    cfg = config_from_dict(tiny_config(tmp_path / "run"))  # fp8-rowwise: 16
    model = nn.ModuleDict({"router": nn.Linear(64, 6), "up": nn.Linear(64, 128)})
    model["lm_head"] = nn.Linear(64, 7)  # kept on purpose, not counted
    text = check_built_model(model, cfg)
    assert text.startswith("1 of 2 linear layers of model.source stay in high precision"), text
    assert "router (64 -> 6)" in text and "multiples of 16" in text


def test_the_partial_conversion_warning_reaches_stderr_events_and_the_run_summary(
    tmp_path, monkeypatch, capsys
):
    import fp8rl.train.trainer as trainer_module
    from fp8rl.cli import main

    text = "1 of 2 linear layers of model.source stay in high precision (test)"
    monkeypatch.setattr(trainer_module, "check_built_model", lambda model, cfg: text)
    cfg = tiny_config(tmp_path / "run")
    cfg["train"]["steps"], cfg["log"]["eval_size"] = 1, 0
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert text in err and json.loads(out)["fp8_conversion_warning"] == text
    final = json.loads((tmp_path / "run" / "final.json").read_text())
    assert final["fp8_conversion_warning"] == text
    assert text in (tmp_path / "run" / "events.log").read_text()


def _qwen3_8b(tmp_path) -> Path:
    """A stand-in for the user's Qwen3-8B checkpoint: its config.json shape."""
    folder = tmp_path / "qwen3-8b"
    if not folder.exists():
        shape = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32)
        _checkpoint(folder, model_type="qwen3", num_key_value_heads=8, head_dim=128, **shape)
    return folder


def _shipped_configs(tmp_path):
    """(name, RunConfig builder) of every run of configs/*.yaml and of the committed study
    specs (docs/**/spec.json), quick demos included."""
    from fp8rl.study.demo import load_demo_spec
    from fp8rl.study.sweep.spec import load_spec, run_configs

    out = tmp_path / "out"
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        text = path.read_text()
        if "\narms:" not in "\n" + text:
            over = [] if "source: tiny" in text else [f"model.source={_qwen3_8b(tmp_path)}"]
            yield path.name, lambda p=path, o=over: [load_config(p, o)]
        elif "\nquick:" in "\n" + text:
            for quick in (False, True):
                spec = load_demo_spec(path, quick=quick)
                spec.pop("quick", None)
                yield f"{path.name} quick={quick}", lambda s=spec: run_configs(load_spec(s), out)
        else:
            yield path.name, lambda p=path: run_configs(load_spec(p), out)
    for path in sorted((ROOT / "docs").glob("**/spec.json")):
        yield str(path.relative_to(ROOT)), lambda p=path: run_configs(load_spec(p), out)


def test_every_shipped_config_and_study_arm_still_validates(tmp_path, monkeypatch):
    # paths are relative to the repository: the committed warm starts under docs/, and the run
    # configs/study.yaml takes its noise model from (a stand-in here)
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    noise_run = tmp_path / "runs" / "study-noise" / "fp8" / "seed-100"
    noise_run.mkdir(parents=True)
    (noise_run / "metrics.jsonl").write_text("")
    # the real model's sweeps name its git-ignored folder: a stand-in with its config.json
    (tmp_path / "models").mkdir()
    _checkpoint(tmp_path / "models" / "smollm2-135m-instruct", **SMOLLM2)
    monkeypatch.chdir(tmp_path)
    names = []
    for name, build in _shipped_configs(tmp_path):
        assert build(), name
        names.append(name)
    assert "study-matched.yaml" in names and "docs/study-long/runs/spec.json" in names
    assert "real-model-noise-keep.yaml" in names


# ---------------------------------------------------------------------------------------
# model.tiny fields (check_tiny_fields)

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
