"""Fault suite: output streams (issue 35). Progress bars and warnings go to stderr and results
to stdout, so `fp8rl train > summary.json` and `fp8rl warmstart > info.json` are JSON; a sweep
(and so the demo) shows each running run's step; `--debug` works after the command too; `fp8rl
train --help` names the loss modes and precisions the config accepts."""

from __future__ import annotations

import json

import pytest
import yaml

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.config.precision import PRECISIONS
from fp8rl.errors import ConfigError
from fp8rl.rl.loss_modes import LOSS_MODES
from fp8rl.study.sweep.workers import _steps_info
from fp8rl.train.runlog import CounterBar
from helpers_config import tiny_config

FAST_WARM_START = {"steps": 4, "batch_size": 8, "target_accuracy": 1.0, "check_every": 2}


def test_a_progress_bar_writes_to_stderr_only(capsys):
    bar = CounterBar(3, "counting", unit="runs")
    bar.update(advance=3)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and "counting" in err and "3/3" in err  # was: all on stdout


def test_fp8rl_train_stdout_is_the_summary_json(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    cfg = tiny_config(tmp_path / "run", log={"progress": True, "eval_size": 0})
    config.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(config)]) == 0  # the bar on: the default
    out, err = capsys.readouterr()
    summary = json.loads(out)  # was: the bar's text before the JSON
    assert summary["steps"] == 2 and "2/2" in err


def test_fp8rl_warmstart_stdout_is_the_info_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    model = {**tiny_config(tmp_path)["model"], "warm_start": "auto"}
    cfg = tiny_config(tmp_path / "run", model=model, warm_start=FAST_WARM_START)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["warmstart", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)  # was: the warm start's bar before the JSON
    assert info["steps"] == 4 and "warm start" in err


def test_a_sweep_bar_names_each_running_run_s_step(tmp_path):
    configs = {
        (arm, 0): config_from_dict(tiny_config(tmp_path / arm, train={"steps": 10}))
        for arm in ("a", "b")
    }
    rows = "".join(json.dumps({"step": s, "rollout/reward": 0.5}) + "\n" for s in range(4))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text(rows + '{"step": 4, "rollout/rew')  # mid-write
    running = {1: (("a", 0), None, None), 2: (("b", 0), None, None)}
    assert _steps_info(running, configs) == "a/seed-0 4/10  b/seed-0 0/10"
    assert _steps_info(running, configs, shown=1) == "a/seed-0 4/10 +1 more"


def test_debug_is_accepted_after_the_command(tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")
    assert main(["train", "--config", missing]) == 2  # one line without --debug
    assert "fp8rl train: error: " in capsys.readouterr().err
    for argv in (["--debug", "train", "--config", missing], ["train", "--config", missing]):
        with pytest.raises(ConfigError, match="missing.yaml"):  # the traceback: was refused
            main(argv + ["--debug"] if argv[0] == "train" else argv)


def test_train_help_names_every_loss_mode_and_precision(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    modes, precisions = text.split("Loss modes (loss.mode): ")[1].split(" Precisions ")
    assert modes.rstrip(".").split(", ") == list(LOSS_MODES)
    assert precisions.split(": ", 1)[1].rstrip(".").split(", ") == list(PRECISIONS)


def test_an_override_after_an_option_is_an_override(monkeypatch, capsys):
    """Was: `fp8rl train train.steps=3 --no-progress rollout.n=2` failed with "unrecognized
    arguments: rollout.n=2", blaming the valid override."""
    from fp8rl import cli

    seen = []
    monkeypatch.setitem(cli.COMMANDS, "train", lambda a: seen.append(a.overrides) or 0)
    argv = ["train", "train.steps=3", "--no-progress", "rollout.n=2", "--resume", "loss.mode=grpo"]
    assert cli.main(argv) == 0
    assert seen == [["train.steps=3", "rollout.n=2", "loss.mode=grpo"]]
    with pytest.raises(SystemExit):  # what is no override is still refused, by name
        cli.main(["train", "a=1", "--no-progress", "stray", "--nope"])
    assert "unrecognized arguments: stray --nope" in capsys.readouterr().err


def test_a_bar_on_a_log_file_or_pipe_prints_plain_lines(capsys):
    """Was: `fp8rl warmstart 2> log` wrote nothing until it ended (rich draws on terminals
    only), so a kill after minutes left no trace of progress."""
    from fp8rl.train.runlog import CounterBar

    bar = CounterBar(20, "warm start", enabled=True)
    for k in range(1, 21):
        bar.update(completed=k, description=f"warm start, loss {1 / k:.3f}")
    bar.close()
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert captured.out == ""
    assert err[0] == "warm start, loss 1.000 1/20" and err[-1] == "warm start, loss 0.050 20/20"
    assert 10 <= len(err) <= 12  # about one a tenth, not one a step
