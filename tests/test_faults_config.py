"""Issue 20, point 8: configs that pass a naive validation but do not mean what they say.

YAML constructs that silently change meaning, `key=value` overrides read other than typed,
paths other than typed, and values that cannot run (refused, one line, nothing written) or
cannot learn (one warning line each) for the task. See docs/reliability.md, "Bad input".
"""

import pytest

from fp8rl.config import config_from_dict, load_config
from fp8rl.errors import ConfigError
from helpers_config import tiny_config, tiny_config_file

# ---------------------------------------------------------------------------------------
# YAML files: (text, needles the one-line error must hold)

YAML_ERRORS = {
    # PyYAML keeps the last of two equal keys without a word
    "duplicate_key": ("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", ["duplicate key 'lr'", "line 3"]),
    "duplicate_section": (
        "train: {steps: 3}\nrollout: {n: 2}\ntrain: {lr: 0.1}\n",
        ["duplicate key 'train'", "line 3", "first on line 1"],
    ),
    # YAML 1.1: 1:30 is the base-60 number 90, 010 the octal 8
    "sexagesimal_int": ("train:\n  steps: 1:30\n", ["'1:30'", "line 2", "base-60", "(90)"]),
    "sexagesimal_float": ("train:\n  lr: 0:0.5\n", ["'0:0.5'", "base-60"]),
    "octal_seed": ("train:\n  seed: 010\n", ["'010'", "line 2", "octal", "(8)"]),
    # an unquoted `on` is the boolean true: the error says to quote it
    "yaml11_bool_as_string": ("name: on\n", ["'name' = True", "quote yes, no, on"]),
    "empty_out_dir": ("log: {out_dir: ''}\n", ["log.out_dir", "a non-empty path"]),
    "spaces_out_dir": ("log: {out_dir: 'runs/a '}\n", ["log.out_dir", "trailing spaces"]),
    "unset_variable": (
        "log: {out_dir: $FP8RL_TEST_UNSET/run}\n",
        ["log.out_dir", "environment variables are set ($FP8RL_TEST_UNSET)"],
    ),
    "empty_model_source": ("model: {source: ''}\n", ["model.source", "a non-empty path"]),
    "tab_indent": ("train:\n\tlr: 0.1\n", ["valid YAML", "'\\t'", "line 2"]),
    "empty_train_path": (
        "task: {name: math, options: {train_path: ['a.jsonl', '']}}\n",
        ["task.options.train_path[1]", "a non-empty path"],
    ),
}


@pytest.mark.parametrize("case", list(YAML_ERRORS))
def test_yaml_that_does_not_mean_what_it_shows_is_a_one_line_error(tmp_path, monkeypatch, case):
    monkeypatch.delenv("FP8RL_TEST_UNSET", raising=False)
    text, needles = YAML_ERRORS[case]
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)


def test_merge_keys_and_a_key_overriding_a_merged_one_are_no_duplicates():
    from fp8rl.config.yaml_strict import load_yaml

    text = "base: &b {n: 2, top_p: 0.5}\nrollout:\n  <<: *b\n  n: 4\n"
    assert load_yaml(text)["rollout"] == {"n": 4, "top_p": 0.5}


def test_yaml_numbers_that_read_as_written_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    # 1e-3 without a dot is a string to PyYAML: a float key still reads it as the number
    path.write_text("train: {lr: 1e-3, steps: 1_000, seed: 0}\nlog: {progress: no}\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.steps, cfg.train.seed) == (0.001, 1000, 0)
    assert cfg.log.progress is False


# ---------------------------------------------------------------------------------------
# Paths: `~` and environment variables expand, relative paths stay relative to the cwd


def test_home_and_environment_variables_in_paths_expand(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FP8RL_TEST_DATA", str(tmp_path / "data"))
    path = tmp_path / "c.yaml"
    path.write_text(
        "task:\n  name: math\n  options:\n"
        "    train_path:\n      - ~/a.jsonl\n      - ${FP8RL_TEST_DATA}/b.jsonl\n"
        "    test_path: $FP8RL_TEST_DATA/t.jsonl\n"
        "log: {out_dir: ~/runs/x}\n"
    )
    cfg = load_config(path)
    assert cfg.log.out_dir == str(tmp_path / "home" / "runs" / "x")
    assert cfg.task.options["train_path"] == [
        str(tmp_path / "home" / "a.jsonl"),
        str(tmp_path / "data" / "b.jsonl"),
    ]
    assert cfg.task.options["test_path"] == str(tmp_path / "data" / "t.jsonl")
    # the saved config holds the path used
    assert cfg.to_dict()["log"]["out_dir"] == cfg.log.out_dir
    # relative paths are the cwd's, as typed (not the config file's folder)
    assert load_config(path, ["log.out_dir=runs/y"]).log.out_dir == "runs/y"


# ---------------------------------------------------------------------------------------
# `key=value` overrides: a string key takes the text as typed

OVERRIDES = {
    # (override, the dotted key, the value it must give)
    "folder_named_by_a_number": ("log.out_dir=123", "log.out_dir", "123"),
    "hash_is_no_comment": ("log.out_dir=runs/a #1", "log.out_dir", "runs/a #1"),
    "name_like_a_float": ("name=1e3", "name", "1e3"),
    "name_like_a_bool": ("name=on", "name", "on"),
    "quoted_string": ("name='x y'", "name", "x y"),
    "float_without_dot": ("train.lr=1e-3", "train.lr", 0.001),
    "null_for_optional": ("model.init_weights=null", "model.init_weights", None),
    "task_option_text": ("task.options.ops=+-", "task.options.ops", "+-"),
    "task_option_number": ("task.options.digits=3", "task.options.digits", 3),
}


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@pytest.mark.parametrize("case", list(OVERRIDES))
def test_override_values_are_what_was_typed(case):
    text, key, expected = OVERRIDES[case]
    cfg = load_config(None, [text])
    value = _get(cfg, key)
    assert value == expected and type(value) is type(expected), (value, expected)


OVERRIDE_ERRORS = {
    "sexagesimal": ("train.steps=1:30", ["train.steps", "base-60", "(90)"]),
    "octal": ("train.seed=010", ["train.seed", "octal", "(8)"]),
    "null_for_required": ("log.out_dir=null", ["log.out_dir", "a value of type str"]),
    "empty_path": ("log.out_dir=", ["log.out_dir"]),
    "unknown_precision": ("rollout.precision=fp8", ["rollout.precision", "fp8-rowwise"]),
    "unknown_key_value_shown_plain": ("train.lrr=1e-3", ["'train.lrr' = 0.001", "one of"]),
    # refused already, kept so: each cannot run or cannot learn at all
    "temperature_0": ("rollout.temperature=0", ["rollout.temperature", "(0.0, 10.0]"]),
    "top_p_0": ("rollout.top_p=0", ["rollout.top_p", "(0.0, 1.0]"]),
    "lr_0": ("train.lr=0", ["train.lr", "(0.0, 1.0]"]),
    "keep_last_0": ("log.keep_last=0", ["log.keep_last", "[1, 1000]"]),
    "mini_batches_over_rows": ("train.mini_batches=257", ["train.mini_batches", "256"]),
}


@pytest.mark.parametrize("case", list(OVERRIDE_ERRORS))
def test_override_that_cannot_mean_what_it_shows_is_an_error(case):
    text, needles = OVERRIDE_ERRORS[case]
    with pytest.raises(ConfigError) as e:
        load_config(None, [text])
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


# ---------------------------------------------------------------------------------------
# Values the task cannot run: refused before the run folder exists


def test_a_task_without_train_problems_is_refused_before_the_run_folder(
    tmp_path, monkeypatch, capsys
):
    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)
    opts = {"digits": 1, "ops": "+", "train_size": 0, "test_size": 4}
    cfg = tiny_config_file(tmp_path, task={"name": "arithmetic", "options": opts})
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", "--config", str(cfg), "--no-progress"]) == 2  # was: ZeroDivisionError
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fp8rl train: error: "), err
    assert "task.options" in lines[0] and "has none" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_evaluating_a_task_without_a_test_split_is_refused_before_training(
    tmp_path, monkeypatch, capsys
):
    from fp8rl.cli import main
    from fp8rl.models import tiny_qwen3
    from fp8rl.tasks import char_tokenizer
    from fp8rl.tasks.math_task import FIXTURE_PATH

    model_dir = tmp_path / "model"  # the math task needs a checkpoint's tokenizer
    tok = char_tokenizer()
    tiny_qwen3(vocab_size=len(tok), hidden_size=32, intermediate_size=64).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    argv = ["train", "--out", "runs/x", "--no-progress", f"model.source={model_dir}"]
    argv += ["task.name=math", f"task.options.train_path={FIXTURE_PATH}", "train.steps=1"]
    argv += ["rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=2"]
    argv += ["train.mini_batches=1", "log.eval_size=4"]
    code = main(argv)
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("fp8rl train: error:")]
    # was: the whole run trained, then the final evaluation failed on the missing test_path
    assert code == 2 and len(ours) == 1, err
    assert "task.options.test_path" in ours[0] and "log.eval_size" in ours[0], ours[0]
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------
# Values that run but cannot learn, or keep less than expected: one warning line each

WARNINGS = {
    "n_1": ({"rollout": {"n": 1}}, "rollout.n = 1: a group of one sample has advantage 0"),
    "more_prompts_than_problems": (
        {"task": {"options": {"digits": 1, "train_size": 3, "test_size": 16}}},
        "rollout.prompts_per_step = 4 is more than the task's 3 train problems",
    ),
    "eval_size_over_test_set": (
        {"task": {"options": {"digits": 1, "train_size": 64, "test_size": 5}}},
        "log.eval_size = 8 is more than the task's 5 test problems: the evaluation uses 5",
    ),
    # one-digit sums are at most "18" then <eos>: 3 tokens
    "max_new_tokens_too_short": (
        {"rollout": {"max_new_tokens": 2}},
        "rollout.max_new_tokens = 2 is below the 3 tokens",
    ),
    "checkpoint_every_over_steps": (
        {"log": {"checkpoint_every": 5}},
        "log.checkpoint_every = 5 is more than train.steps = 1: only the last step",
    ),
    "eval_every_over_steps": (
        {"log": {"eval_every": 5}},
        "log.eval_every = 5 is more than train.steps = 1: no evaluation during the run",
    ),
    # pooled over at most 5 shadow steps of 4 x 4 responses of at most 4 tokens: 320 tokens
    "min_tokens_unreachable": (
        {"loss": {"mode": "calibrated"}, "calibration": {"interval": 1, "min_tokens": 321}},
        "calibration.min_tokens = 321 is more than the 320 response tokens",
    ),
    # GSPO pools responses, not tokens: 5 shadow steps of 4 x 4 responses
    "min_tokens_unreachable_gspo": (
        {"loss": {"mode": "gspo_calibrated"}, "calibration": {"interval": 1, "min_tokens": 81}},
        "calibration.min_tokens = 81 is more than the 80 responses",
    ),
    "calibrated_never_refits": (
        {"loss": {"mode": "calibrated"}, "calibration": {"interval": 20, "min_tokens": 2}},
        "calibration.interval = 20 with train.steps = 2: the bounds are never refit",
    ),
    # the rule's row sets the first refit step: direct-first's, as pooled's, is interval
    "direct_first_never_refits": (
        {
            "loss": {"mode": "calibrated"},
            "calibration": {"interval": 20, "min_tokens": 2, "rule": "direct-first"},
        },
        "calibration.interval = 20 with train.steps = 2: the bounds are never refit",
    ),
}


def _fit_stderr(tmp_path, capsys, **sections) -> list[str]:
    from fp8rl.train.trainer import Trainer

    data = tiny_config(tmp_path / "run", **sections)
    calibrated = data["loss"]["mode"] in ("calibrated", "gspo_calibrated")
    steps = 2 if calibrated else 1  # pooled: step 1 is the first refit
    data["train"] = {**data["train"], "steps": steps, "mini_batches": 1}
    trainer = Trainer(config_from_dict(data), progress=False)
    capsys.readouterr()
    trainer.fit()
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", list(WARNINGS))
def test_a_run_that_cannot_learn_or_keeps_less_warns_in_one_line(tmp_path, capsys, case):
    sections, needle = WARNINGS[case]
    lines = _fit_stderr(tmp_path, capsys, **sections)
    ours = [line for line in lines if line.startswith("fp8rl: warning: ")]
    assert len(ours) == 1 and needle in ours[0], lines


@pytest.mark.parametrize("mode", ["grpo", "calibrated", "gspo_calibrated"])
def test_a_sound_config_gets_no_warning(tmp_path, capsys, mode):
    lines = _fit_stderr(tmp_path, capsys, loss={"mode": mode})
    assert not [line for line in lines if line.startswith("fp8rl: warning: ")], lines


# ---------------------------------------------------------------------------------------
# Task options: YAML 1.1 reads an unquoted yes/on as true, which isinstance takes for 1

TASK_OPTION_ERRORS = {
    "arithmetic_digits_yes": ("arithmetic", {"digits": True}, "'digits' = True"),
    "arithmetic_test_size_on": ("arithmetic", {"test_size": True}, "'test_size' = True"),
    "chain_seed_on": ("chain_arithmetic", {"seed": True}, "'seed' = True"),
    "math_workers_yes": ("math", {"workers": True}, "'workers' = True"),
    "math_prompt_key_no": ("math", {"prompt_key": False}, "'prompt_key' = False"),
}


@pytest.mark.parametrize("case", list(TASK_OPTION_ERRORS))
def test_a_boolean_task_option_where_a_number_or_name_goes_is_an_error(case):
    from fp8rl.tasks import get_task

    name, options, needle = TASK_OPTION_ERRORS[case]
    with pytest.raises(ConfigError) as e:
        get_task(name, **options)
    assert needle in str(e.value), str(e.value)


def test_a_sweep_spec_with_an_arm_named_twice_is_an_error_naming_the_line(tmp_path):
    from fp8rl.study.sweep.spec import load_spec

    path = tmp_path / "spec.yaml"
    # PyYAML kept the second fp8 arm only: a sweep of two arms, not three, without a word
    path.write_text("arms:\n  bf16: {}\n  fp8: {}\n  fp8: {train: {lr: 0.1}}\nseeds: [0]\n")
    with pytest.raises(ConfigError) as e:
        load_spec(path)
    assert "duplicate key 'fp8' on line 4 (first on line 3)" in str(e.value), str(e.value)


def test_a_demo_config_with_a_duplicate_key_is_an_error(tmp_path):
    from fp8rl.study.demo import load_demo_spec

    path = tmp_path / "demo.yaml"
    path.write_text("base: {}\narms: {a: {}}\nseeds: [0, 1]\nseeds: [2]\n")
    with pytest.raises(ConfigError, match="duplicate key 'seeds' on line 4"):
        load_demo_spec(path)


def test_a_demo_spec_that_is_empty_or_no_mapping_is_one_line(tmp_path):
    """Was: `fp8rl demo --config EMPTY` an AttributeError traceback."""
    from fp8rl.study.demo import load_demo_spec

    for text in ("", "0\n", "base: 0\n", "- a\n"):
        path = tmp_path / "demo.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_demo_spec(path)
        assert e.value.key == "--config" and "a mapping with a `base:`" in str(e.value)
