"""Options whose dependency is missing (checked as a run starts, so that a config for another
machine still loads) and values that make a run do nothing (at validation): each a one-line
ConfigError naming the key, before any run folder. A run whose every update was skipped does
not exit 0: one line, after final.json records it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from helpers_config import tiny_config
from helpers_runs import one_error_line


def _refused(tmp_path, capsys, key, *overrides):
    run = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_config(run)))
    assert main(["train", "--config", str(cfg), "--no-progress", *overrides]) == 2
    line = one_error_line(capsys, f"config key '{key}'")
    assert not run.exists()
    return line


@pytest.mark.parametrize(
    "extra,key,value",
    [
        ("tensorboard", "log.tensorboard", "true"),
        ("wandb", "log.wandb", "{project: p, mode: offline}"),
    ],
)
def test_an_option_whose_extra_is_missing_is_refused_before_the_run_folder(
    tmp_path, capsys, monkeypatch, extra, key, value
):
    """Was: an ImportError after the run folder was made."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == extra else real(n, *a)
    )
    line = _refused(tmp_path, capsys, key, f"{key}={value}")
    assert f"pip install fp8rl[{extra}]" in line


@pytest.mark.parametrize(
    "override,key",
    [
        ("loss.overlong_factor=.inf", "loss.overlong_factor"),  # was: every update skipped, exit 0
        ("loss.overlong_factor=.nan", "loss.overlong_factor"),
        ("log.eval_every=1", "log.eval_every"),  # with log.eval_size=0: was the whole split
    ],
)
def test_a_value_that_makes_the_run_do_nothing_is_refused(tmp_path, capsys, override, key):
    _refused(tmp_path, capsys, key, override, "log.eval_size=0")


def test_an_evaluation_of_size_0_evaluates_nothing():
    from fp8rl.tasks import get_task
    from fp8rl.train.evaluate import evaluate_policy

    task = get_task("arithmetic", digits=1, ops="+", train_size=8, test_size=8)
    assert evaluate_policy(None, None, task, limit=0) == {}  # was: the whole test split


def test_an_empty_home_puts_no_cache_at_the_filesystem_root(tmp_path, monkeypatch):
    from fp8rl.train import warmstart

    monkeypatch.delenv("FP8RL_CACHE", raising=False)
    monkeypatch.setenv("HOME", "")
    data = tiny_config(tmp_path / "run", model={"warm_start": "auto"})
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert e.value.key == "model.warm_start"
    with pytest.raises(ConfigError):
        warmstart.cache_dir()  # was: Path('/.cache/fp8rl')
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    assert config_from_dict(data).model.warm_start == "auto"
    assert warmstart.cache_dir() == tmp_path / "cache"


def test_a_run_whose_every_update_was_skipped_exits_nonzero(tmp_path, capsys, monkeypatch):
    """Was: exit 0, weights never moved."""
    from fp8rl.step import update as step_mod

    real_loss = step_mod.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(step_mod, "policy_loss", nan_loss)
    run = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_config(run, log={"eval_size": 0})))
    assert main(["train", "--config", str(cfg), "--no-progress"]) == 2
    one_error_line(capsys, "every one of the run's 4 updates was skipped")
    assert "every one" in json.loads((run / "final.json").read_text())["all_updates_skipped"]
