"""`fp8rl train --resume` continues exactly the run that is in the folder, or refuses in one
line with the folder byte for byte as it was: a train.steps below the checkpoint's step, a
config.json that cannot say where the run ends, a folder without a run. A resume builds no
warm start (the checkpoint's weights replace it). final.json covering the whole run is
test_a_killed_and_resumed_run_sums_up_like_an_uninterrupted_one (test_faults_runfolder.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from fp8rl.cli import main
from fp8rl.train import trainer as trainer_mod
from fp8rl.train.runlog import read_metrics
from helpers_config import tiny_config
from helpers_runs import one_error_line, snapshot


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 2-step run with checkpoints at steps 1 and 2, and its config file."""
    root = tmp_path_factory.mktemp("trained")
    data = tiny_config(root / "run", log={"checkpoint_every": 1, "eval_size": 0})
    cfg_path = root / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    return cfg_path, root / "run"


def _resume(cfg_path, run, *more):
    return main(
        ["train", "--config", str(cfg_path), "--out", str(run), "--no-progress", "--resume", *more]
    )


def test_train_steps_below_the_checkpoint_is_refused(trained, tmp_path, capsys):
    """Was: exit 0, config.json rewritten to train.steps=1 over a run of 2 steps."""
    cfg_path, src = trained
    run = shutil.copytree(src, tmp_path / "run")
    before = snapshot(run)
    assert _resume(cfg_path, run, "train.steps=1") == 2
    one_error_line(capsys, "train.steps = 1 is below the step of step_00000002 (2)")
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", ["garbage", "missing", "no-steps", "steps-string"])
def test_a_config_json_that_cannot_say_the_steps_is_refused(trained, tmp_path, capsys, damage):
    """Was: the config file's train.steps, silently."""
    cfg_path, src = trained
    run = shutil.copytree(src, tmp_path / "run")
    shutil.rmtree(run / "checkpoints" / "step_00000002")  # as a kill after step 1 leaves it
    config = run / "config.json"
    if damage == "missing":
        config.unlink()
    else:
        data = json.loads(config.read_text())
        if damage == "no-steps":
            del data["train"]["steps"]
        elif damage == "steps-string":
            data["train"]["steps"] = "2"
        config.write_text("{not json" if damage == "garbage" else json.dumps(data))
    before = snapshot(run)
    assert _resume(cfg_path, run) == 2
    one_error_line(capsys, f"cannot read the run's train.steps from {config}")
    assert snapshot(run) == before
    # saying where the run ends resumes it
    assert _resume(cfg_path, run, "train.steps=2") == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1]


def test_a_resume_builds_no_warm_start(trained, tmp_path, monkeypatch):
    """The checkpoint's weights replace the start weights: the `auto` warm start (minutes to
    build) is never asked for. Was: built, then thrown away by the checkpoint load."""
    cfg_path, src = trained
    run = shutil.copytree(src, tmp_path / "run")

    def never(*a, **kw):
        raise AssertionError("a resume asked for the start weights")

    monkeypatch.setattr(trainer_mod, "start_weights", never)
    assert _resume(cfg_path, run, "train.steps=3", "model.warm_start=auto") == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
