"""Issue 20, point 8: configs that pass a naive validation but do not mean what they say, where
the check is not config/'s own: values the task cannot run (refused, one line, nothing
written) or cannot learn (one warning line each, train/fit_checks.py), task options YAML
reads as booleans, and the sweep and demo specs' YAML. See docs/reliability.md, "Bad input".
YAML constructs, overrides and paths that change meaning are the tests/test_config_*.py of
the module that refuses them (yaml_strict, build, files, load).
"""

import pytest

from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from helpers_config import tiny_config, tiny_config_file

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
