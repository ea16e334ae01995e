"""Trusted files that are checked before use: a checkpoint's state.json of the wrong shape is
corrupt like a hash mismatch (a resume falls back to the newest intact checkpoint), and a
bad cached warm start is rebuilt with a one-line notice."""

import json
import shutil

import pytest

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.train import run_folder
from fp8rl.train import warmstart as ws
from fp8rl.train.checkpoint import list_checkpoints
from fp8rl.train.runlog import read_metrics
from helpers_config import tiny_config, warm_start_config
from helpers_runs import counting_builds, snapshot


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 3-step run with checkpoints at steps 1, 2 and 3, and its config file."""
    root = tmp_path_factory.mktemp("finished")
    log = {"checkpoint_every": 1, "keep_last": 3, "eval_size": 0}
    data = tiny_config(root / "run", train={"steps": 3}, log=log)
    cfg_path = root / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    return cfg_path, root / "run"


def _edit_state(ckpt, change):
    file = ckpt / "state.json"
    state = json.loads(file.read_text())
    change(state)
    file.write_text(json.dumps(state))


def _set(key, value):
    def change(state):
        node = state
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value

    return change


def _drop(key):
    return lambda state: state.pop(key)


# each: what today's code (before this check) did with it on --resume
WRONG_STATES = {
    "step-is-a-string": (_set("step", "3"), "'step'"),  # caught before too: no step
    "step-is-a-bool": (_set("step", True), "'step'"),  # resumed at step 1
    "step-of-another-checkpoint": (_set("step", 1), "'step'"),  # resumed at 1 with 3's weights
    "optimizer-is-a-list": (_set("optimizer", []), "'optimizer'"),  # TypeError traceback
    "param-groups-missing": (_set("optimizer", {}), "'param_groups'"),  # KeyError traceback
    "python-rng-is-text": (_set("rng.python", "x"), "'python'"),  # ValueError traceback
    "tensor-files-is-text": (_set("tensor_files", "pool"), "'tensor_files'"),  # missing 'p.st..'
    "files-is-a-list": (_set("files", ["model.safetensors"]), "'files'"),  # caught before too
    "calibration-is-a-list": (_set("calibration", []), "'calibration'"),  # traceback
    "calibration-bound-is-text": (_set("calibration.lower", "x"), "'calibration'"),  # traceback
    "entropy-surge-missing": (_drop("entropy_surge"), "'entropy_surge'"),  # KeyError traceback
    "skipped-updates-negative": (_set("skipped_updates", -1), "'skipped_updates'"),  # kept
    "config-is-text": (_set("config", "x"), "'config'"),  # skipped the resume config check
}


@pytest.mark.parametrize("case", list(WRONG_STATES))
def test_a_wrong_state_json_is_corrupt_and_resume_falls_back(finished, tmp_path, case):
    cfg_path, src = finished
    run = shutil.copytree(src, tmp_path / "run")
    change, key = WRONG_STATES[case]
    newest = list_checkpoints(run)[-1]
    _edit_state(newest, change)
    before = snapshot(run)
    cfg = config_from_dict({**json.loads(cfg_path.read_text()), "log": {"out_dir": str(run)}})
    plan = run_folder.check(cfg, resume=True, overwrite=False)
    assert plan.checkpoint.name == "step_00000002" and plan.state["step"] == 2
    ((bad, reason),) = plan.corrupt
    assert bad == newest and f"{newest / 'state.json'}: {key}" in reason and "\n" not in reason
    assert snapshot(run) == before  # check only reads


def test_resume_past_a_state_json_missing_a_key_logs_the_same_metrics(finished, tmp_path, capsys):
    cfg_path, src = finished
    run = shutil.copytree(src, tmp_path / "run")
    newest = list_checkpoints(run)[-1]
    _edit_state(newest, _drop("entropy_surge"))  # before: a KeyError traceback
    argv = ["train", "--config", str(cfg_path), "--out", str(run), "--no-progress", "--resume"]
    assert main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'entropy_surge'" in err[0] and str(newest / "state.json") in err[0]
    assert (run / "checkpoints" / "corrupt" / newest.name).is_dir()
    # step 2 ran again from checkpoint 2: its row equals the uninterrupted run's
    rows, full = read_metrics(run), read_metrics(src)
    drop = ("time/",)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for a, b in zip(rows, full, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(drop)} == {
            k: v for k, v in b.items() if not k.startswith(drop)
        }


# ---------------------------------------------------------------- the warm-start cache


def _cut(weights, info):
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _changed(weights, info):  # same size, still parses: only the hash can tell
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))


def _info_garbage(weights, info):
    info.write_bytes(b'{"steps": 3\xff')


def _weights_missing(weights, info):
    weights.unlink()


def _no_hash(weights, info):  # an entry from before entries carried a hash
    kept = {k: v for k, v in json.loads(info.read_text()).items() if k != "sha256"}
    info.write_text(json.dumps(kept))


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """One built warm-start entry, copied per test (building is the slow part)."""
    root = tmp_path_factory.mktemp("ws")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FP8RL_CACHE", str(root / "cache"))
        cfg = warm_start_config(root)
        ws.ensure_warm_start(cfg)
    return root / "cache", cfg


@pytest.mark.parametrize(
    "damage",
    [_cut, _changed, _info_garbage, _weights_missing, _no_hash],
    ids=["cut", "changed", "info-garbage", "weights-missing", "no-hash"],
)
def test_a_bad_warm_start_entry_is_rebuilt_with_a_notice(
    built_cache, tmp_path, monkeypatch, capsys, damage
):
    src, cfg = built_cache
    cache = shutil.copytree(src, tmp_path / "cache")
    monkeypatch.setenv("FP8RL_CACHE", str(cache))
    weights = ws.cached_path(cfg)
    info_file = weights.with_suffix(".json")
    good = (src / weights.relative_to(cache)).read_bytes()
    damage(weights, info_file)
    calls = counting_builds(monkeypatch)
    path, info = ws.ensure_warm_start(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(calls) == 1 and len(err) == 1, err
    assert err[0].startswith("fp8rl: warning: warm-start cache: ") and "rebuilding" in err[0]
    # the rebuild is the same seeded warm start, and it is used from now on without a notice
    assert path == weights and weights.read_bytes() == good
    assert json.loads(info_file.read_text()) == info and info["sha256"] == ws.sha256_file(path)
    assert ws.ensure_warm_start(cfg)[1] == info and len(calls) == 1
    assert not capsys.readouterr().err


def test_a_killed_warm_start_build_continues_to_the_same_weights(tmp_path, monkeypatch, capsys):
    """Was: a kill after minutes threw the whole build away. It keeps its own checkpoint
    every check_every steps; the next build continues from it to the bytes of a build that
    was never killed, then removes it."""
    import torch

    from fp8rl.utils import sha256_file

    short = {"steps": 12, "check_every": 4, "target_accuracy": 1.0}
    cfg = warm_start_config(tmp_path / "run", warm_start=short)
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "whole"))
    whole, whole_info = ws.ensure_warm_start(cfg)
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "killed"))
    real, calls = torch.optim.AdamW.step, [0]

    def dying(self, *args, **kw):
        calls[0] += 1
        if calls[0] == 7:  # a kill during step 7: the checkpoint of step 4 is the newest
            raise KeyboardInterrupt
        return real(self, *args, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying)
    with pytest.raises(KeyboardInterrupt):
        ws.ensure_warm_start(cfg)
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    (partial,) = (tmp_path / "killed" / "warmstart").glob(".*.partial")
    assert [p.name for p in list_checkpoints(partial)] == ["step_00000004"]
    capsys.readouterr()
    killed, info = ws.ensure_warm_start(cfg)
    assert "continuing the build killed after step 4" in capsys.readouterr().err
    assert sha256_file(killed) == sha256_file(whole)
    assert info["steps"] == whole_info["steps"] == 12
    assert info["train_accuracy"] == whole_info["train_accuracy"]
    assert not partial.exists()
