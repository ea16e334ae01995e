"""Options that would make a run do nothing: an evaluation of size 0 evaluates nothing, a
warm-start cache never lands at the filesystem root, and a run whose every update was skipped
does not exit 0 (one line, after final.json records it). Options refused at validation or as
a run starts are tests/test_config_validate.py's."""

from __future__ import annotations

import json

import pytest

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from helpers_config import tiny_config
from helpers_runs import one_error_line


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
