"""Faults of files and run folders: nothing is lost, every bad input is a
clear error. Run folders are never silently reused; checkpoints verify themselves and fall
back to the newest intact one; SIGKILL or a full disk during a checkpoint write leaves the
previous one resumable; a corrupt metrics line drops nothing after it."""

import errno
import json
import os
import random
import signal
import struct

import pytest
import torch
from safetensors import SafetensorError

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import CheckpointError, Fp8rlError
from fp8rl.models import tiny_qwen3
from fp8rl.train import checkpoint as ck
from fp8rl.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from fp8rl.train.runlog import read_metrics
from helpers_config import tiny_config
from helpers_runs import one_error_line, snapshot, train_argv, trained_model

_model_opt = trained_model  # a one-layer model with AdamW moments


def _save(run, step, model, opt, keep_last=10):
    pool = {"calibration_pool": {"x": torch.arange(4.0)}}
    return save_checkpoint(run, step, model, opt, {"k": step}, keep_last=keep_last, tensors=pool)


# ---------------------------------------------------------------- checkpoints verify themselves


def test_state_json_records_a_sha256_of_every_file(tmp_path):
    model, opt = _model_opt()
    path = _save(tmp_path, 1, model, opt)
    files = json.loads((path / "state.json").read_text())["files"]
    assert sorted(files) == [
        "calibration_pool.safetensors",
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
    ]
    assert all(files[n] == ck.sha256_file(path / n) for n in files)
    assert verify_checkpoint(path)["step"] == 1


def _flip_finite(file):
    """Overwrite the last float32 of the file with another finite value (the header stays valid)."""
    data = bytearray(file.read_bytes())
    old = struct.unpack("<f", data[-4:])[0]
    data[-4:] = struct.pack("<f", old + 0.5)
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "fault,needle",
    [
        ("flip-model", "model.safetensors"),
        ("truncate-optimizer", "optimizer.safetensors"),
        ("missing-rng", "rng.safetensors"),
        ("missing-pool", "calibration_pool.safetensors"),
        ("state-empty", "state.json"),
        ("state-garbage", "state.json"),
    ],
)
def test_each_corruption_is_a_one_line_checkpoint_error(tmp_path, fault, needle):
    model, opt = _model_opt()
    path = _save(tmp_path, 1, model, opt)
    if fault == "flip-model":
        _flip_finite(path / "model.safetensors")
        # the garbage is finite and the file still parses: only the hash can tell
        from safetensors.torch import load_file

        assert all(
            torch.isfinite(t).all() for t in load_file(str(path / "model.safetensors")).values()
        )
    elif fault == "truncate-optimizer":
        f = path / "optimizer.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif fault == "missing-rng":
        (path / "rng.safetensors").unlink()
    elif fault == "missing-pool":
        (path / "calibration_pool.safetensors").unlink()
    elif fault == "state-empty":
        (path / "state.json").write_text("{}")
    else:
        (path / "state.json").write_bytes(b'{"step": 1, "files"\xff')
    fresh, fresh_opt = _model_opt(seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=needle.replace(".", r"\.")) as e:
        load_checkpoint(path, fresh, fresh_opt)
    assert "\n" not in str(e.value)
    # verification comes first: nothing was loaded into the model
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_the_fsdp2_loader_verifies_too(tmp_path):
    from fp8rl.train.distributed import _load_full_state

    model, opt = _model_opt()
    path = _save(tmp_path, 1, model, opt)
    _flip_finite(path / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is corrupt"):
        _load_full_state(path, *_model_opt(seed=1))


def test_a_checkpoint_from_before_hashes_still_loads(tmp_path):
    model, opt = _model_opt()
    path = _save(tmp_path, 1, model, opt)
    state = json.loads((path / "state.json").read_text())
    del state["files"]
    (path / "state.json").write_text(json.dumps(state))
    other, other_opt = _model_opt(seed=1)
    assert load_checkpoint(path, other, other_opt)["step"] == 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True)
    )


def test_corrupt_newest_falls_back_and_moves_aside(tmp_path, capsys):
    model, opt = _model_opt()
    for step in (2, 4, 6):
        _save(tmp_path, step, model, opt)
    _flip_finite(list_checkpoints(tmp_path)[-1] / "model.safetensors")
    (list_checkpoints(tmp_path)[-2] / "state.json").write_text("{}")
    assert latest_checkpoint(tmp_path, move_corrupt=True).name == "step_00000002"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "step_00000006/model.safetensors" in err[0] and "state.json" in err[1]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "corrupt").iterdir()) == [
        "step_00000004",
        "step_00000006",
    ]
    # neither pruning nor the next resume sees them again
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002"]
    _save(tmp_path, 3, model, opt, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003"]
    assert len(list((tmp_path / "checkpoints" / "corrupt").iterdir())) == 2


def test_pruning_keeps_steps_above_the_current_one(tmp_path):
    model, opt = _model_opt()
    for step in (7, 8):  # what another run left behind
        _save(tmp_path, step, model, opt)
    for step in (1, 2, 3):
        _save(tmp_path, step, model, opt, keep_last=2)
    assert [p.name[-1] for p in list_checkpoints(tmp_path)] == ["2", "3", "7", "8"]


# ---------------------------------------------------------------- SIGKILL and ENOSPC mid-write

# the writes of one checkpoint, in order: model, optimizer, rng, pool, state.json, the rename
# into place. The writer dies at one of them: before it, or with its file half written.
_WRITES = 6


def _killed_writer(run, stage, half, model, opt):
    """Fork a child that saves step 2 and SIGKILLs itself at write number `stage`; True when
    it died so. (The model is built here: the child computes nothing, it only writes.)"""
    pid = os.fork()
    if pid == 0:  # the child
        try:
            calls = [0]

            def hook(real, name):
                def wrapped(*args, **kw):
                    calls[0] += 1
                    if calls[0] == stage:
                        if half and name == "file":
                            real(*args, **kw)
                            with open(args[1], "r+b") as f:
                                f.truncate(os.path.getsize(args[1]) // 2)
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kw)

                return wrapped

            ck.save_model = hook(ck.save_model, "file")
            ck.save_file = hook(ck.save_file, "file")
            ck.json.dump = hook(json.dump, "json")
            ck.os.replace = hook(os.replace, "rename")
            _save(run, 2, model, opt)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_sigkill_at_every_point_of_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    model, opt = _model_opt()
    run = tmp_path / "run"
    first = _save(run, 1, model, opt)
    intact = snapshot(first)
    # seeded order of the points; each before the write and half-way through its file
    for stage in random.Random(13).sample(range(1, _WRITES + 1), _WRITES):
        for half in (False, True):
            assert _killed_writer(run, stage, half, model, opt), (stage, half)
            assert latest_checkpoint(run) == first and snapshot(first) == intact, (stage, half)
            other, other_opt = _model_opt(seed=1)
            assert load_checkpoint(first, other, other_opt)["step"] == 1
    # past the last write point the same child completes step 2: the points cover the writer
    assert not _killed_writer(run, _WRITES + 1, False, model, opt)
    assert verify_checkpoint(latest_checkpoint(run))["step"] == 2
    ck.shutil.rmtree(latest_checkpoint(run))
    # the next write clears the half-written temporary folders and succeeds
    _save(run, 3, model, opt)
    assert [p.name for p in list_checkpoints(run)] == ["step_00000001", "step_00000003"]
    assert not list((run / "checkpoints").glob(".tmp-*"))


_WRITER = """
import sys, torch
from fp8rl.models import tiny_qwen3
from fp8rl.train.checkpoint import save_checkpoint
model = tiny_qwen3(num_hidden_layers=4, hidden_size=256, intermediate_size=512, seed=0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits.sum().backward()
opt.step()
print("ready", flush=True)
for step in range(int(sys.argv[2]), 10**6):
    save_checkpoint(sys.argv[1], step, model, opt, {}, keep_last=2)
"""


@pytest.mark.slow
def test_sigkill_at_random_times_during_checkpoint_writes(tmp_path):
    """A real writer process killed at seeded random moments of a loop of checkpoint writes:
    after every kill the newest complete checkpoint verifies and loads."""
    import subprocess
    import sys
    import time

    run, rng, start = tmp_path / "run", random.Random(7), 1
    first = tiny_qwen3(num_hidden_layers=4, hidden_size=256, intermediate_size=512, seed=0)
    save_checkpoint(run, 0, first, torch.optim.AdamW(first.parameters()), {})  # one to keep
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(run), str(start)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        latest = latest_checkpoint(run)
        assert latest is not None and verify_checkpoint(latest)
        model = tiny_qwen3(num_hidden_layers=4, hidden_size=256, intermediate_size=512, seed=1)
        load_checkpoint(latest, model, torch.optim.AdamW(model.parameters()))
        start = int(latest.name[5:]) + 1


def _enospc_on(call_number, error):
    calls = [0]
    real = ck.save_file

    def save_file(*args, **kw):
        calls[0] += 1
        if calls[0] == call_number:
            raise error
        return real(*args, **kw)

    return save_file


# the OS's own error, and the one the real writer raises for it: safetensors wraps it in
# its SafetensorError (not an OSError), in the words it uses for a real EFBIG
_FULL = [
    OSError(errno.ENOSPC, "No space left on device"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
]


@pytest.mark.parametrize("error", _FULL, ids=["OSError", "SafetensorError"])
def test_enospc_fails_the_run_with_one_line_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, capsys, error
):
    run = tmp_path / "run"
    cfg = tiny_config(run, train={"steps": 3}, log={"checkpoint_every": 1, "eval_size": 0})
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(cfg))
    # save_file: optimizer, rng, pool per checkpoint; the 5th is the second checkpoint's rng
    monkeypatch.setattr(ck, "save_file", _enospc_on(5, error))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 2
    line = one_error_line(capsys, "No space left on device (errno 28)")
    assert f"cannot write checkpoint {run}/checkpoints/step_00000002/rng.safetensors" in line
    assert line.endswith("; the older checkpoints are intact")
    assert [p.name for p in list_checkpoints(run)] == ["step_00000001"]
    assert not list((run / "checkpoints").glob(".tmp-*"))
    verify_checkpoint(list_checkpoints(run)[0])
    monkeypatch.undo()
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]


# ---------------------------------------------------------------- run folders are never reused


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 2-step run with checkpoints at steps 1 and 2, and its config file."""
    root = tmp_path_factory.mktemp("trained")
    run = root / "run"
    data = tiny_config(run, log={"checkpoint_every": 1, "eval_size": 0})
    cfg_path = root / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    return root, cfg_path, run


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([], "--overwrite"),
        (["--resume", "train.lr=0.002"], "train.lr (0.001 -> 0.002)"),
        (["--resume", "rollout.n=2"], "rollout.n"),
        (["--resume", "loss.mode=dapo"], "loss.mode"),
        (["--resume", "train.seed=3"], "train.seed"),
    ],
)
def test_reusing_a_run_folder_needs_a_flag_and_changes_nothing(
    trained, tmp_path, capsys, argv, needle
):
    _, cfg_path, src = trained
    run = _copy(src, tmp_path / "run")
    before = snapshot(run)
    assert main(train_argv(cfg_path, run, *argv)) == 2
    one_error_line(capsys, needle)
    assert snapshot(run) == before


def test_resume_without_a_checkpoint_or_without_a_run_is_an_error(trained, tmp_path, capsys):
    _, cfg_path, src = trained
    run = _copy(src, tmp_path / "run")
    ck.shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    assert main(train_argv(cfg_path, run, "--resume")) == 2
    one_error_line(capsys, "no checkpoint")
    assert snapshot(run) == before
    # every checkpoint corrupt: an error too, and nothing moves
    run2 = _copy(src, tmp_path / "run2")
    for p in list_checkpoints(run2):
        (p / "state.json").write_text("{}")
    before = snapshot(run2)
    assert main(train_argv(cfg_path, run2, "--resume")) == 2
    one_error_line(capsys, "no intact checkpoint")
    assert snapshot(run2) == before
    # an empty (or new) folder: --resume refuses (was: a fresh run from step 0, quietly)
    (tmp_path / "empty").mkdir()
    argv = ["train", "--config", str(cfg_path), "--no-progress", "--resume"]
    assert main([*argv, "--out", str(tmp_path / "empty")]) == 2
    one_error_line(capsys, "holds no run to continue")
    assert list((tmp_path / "empty").iterdir()) == []
    assert main([*argv, "--out", str(tmp_path / "new")]) == 2
    one_error_line(capsys, "holds no run to continue")
    assert not (tmp_path / "new").exists()


def test_resume_with_more_steps_continues(trained, tmp_path):
    root, cfg_path, src = trained
    run = _copy(src, tmp_path / "run")
    assert (
        main(
            train_argv(
                cfg_path, run, "--resume", "train.steps=4", "log.keep_last=3", "log.progress=false"
            )
        )
        == 0
    )
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[:2] == read_metrics(src)  # the first run's rows, untouched
    assert [p.name[-1] for p in list_checkpoints(run)] == ["2", "3", "4"]


def test_overwrite_moves_the_old_run_aside(trained, tmp_path, capsys):
    _, cfg_path, src = trained
    run = _copy(src, tmp_path / "run")
    before = snapshot(run)
    assert main(train_argv(cfg_path, run, "--overwrite", "train.steps=1")) == 0
    moved = [ln for ln in capsys.readouterr().err.splitlines() if "--overwrite" in ln]
    assert len(moved) == 1 and ".old-" in moved[0]
    (old,) = run.glob(".old-*")
    assert snapshot(old) == before  # nothing lost
    assert [r["step"] for r in read_metrics(run)] == [0]
    assert [p.name for p in list_checkpoints(run)] == ["step_00000001"]
    with pytest.raises(SystemExit) as e:  # the two flags exclude each other
        main(["train", "--config", str(cfg_path), "--resume", "--overwrite"])
    assert e.value.code == 2


def test_library_fit_refuses_a_used_folder_before_writing(trained, tmp_path):
    from fp8rl.train.trainer import Trainer

    _, cfg_path, src = trained
    run = _copy(src, tmp_path / "run")
    before = snapshot(run)
    data = json.loads(cfg_path.read_text())
    data["log"]["out_dir"] = str(run)
    with pytest.raises(Fp8rlError, match="already holds"):
        Trainer(config_from_dict(data)).fit()
    assert snapshot(run) == before


def test_one_trainer_may_continue_its_own_run_in_process(tmp_path):
    """A second fit() of the same Trainer (the bench steps one fit at a time) continues its run:
    the folder is its own, every row is kept, and it equals one uninterrupted fit."""
    from fp8rl.train.trainer import Trainer

    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    data = tiny_config(tmp_path / "stepwise", train={"steps": 3})
    stepwise = Trainer(config_from_dict(data))
    rows = []
    for n in (1, 2, 3):
        stepwise.cfg.train.steps = n
        rows += stepwise.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "stepwise")] == [0, 1, 2]
    whole = Trainer(config_from_dict(tiny_config(tmp_path / "whole", train={"steps": 3}))).fit()
    assert strip(rows) == strip(whole)
    with pytest.raises(Fp8rlError, match="already holds"):  # another Trainer still may not
        Trainer(config_from_dict(data)).fit()


def test_run_and_train_step_step_a_run_without_changing_its_config(tmp_path):
    """The bench's way to stop between steps: run(1) / train_step() continue one run, leave
    cfg.train.steps alone, and give the rows of one uninterrupted fit."""
    from fp8rl.train.trainer import Trainer

    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    data = tiny_config(tmp_path / "stepwise", train={"steps": 3})
    stepwise = Trainer(config_from_dict(data))
    rows = stepwise.run(1) + [stepwise.train_step()] + stepwise.run(1)
    assert stepwise.step == 3 and stepwise.cfg.train.steps == 3 and stepwise.run(0) == []
    assert [r["step"] for r in read_metrics(tmp_path / "stepwise")] == [0, 1, 2]
    whole = Trainer(config_from_dict(tiny_config(tmp_path / "whole", train={"steps": 3}))).fit()
    assert strip(rows) == strip(whole)


# ---------------------------------------------------------------- checkpoint fallback end to end


def test_resume_falls_back_past_a_corrupt_checkpoint_and_logs_the_same_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    data = tiny_config(
        run, train={"steps": 3}, log={"checkpoint_every": 1, "keep_last": 3, "eval_size": 0}
    )
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    full = read_metrics(run)
    _flip_finite(run / "checkpoints" / "step_00000003" / "model.safetensors")
    f = run / "checkpoints" / "step_00000002" / "optimizer.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    warns = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(warns) == 2 and "step_00000003/model.safetensors" in warns[0]
    assert "step_00000002/optimizer.safetensors" in warns[1]
    assert sorted(p.name for p in (run / "checkpoints" / "corrupt").iterdir()) == [
        "step_00000002",
        "step_00000003",
    ]
    strip = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run)]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in full]
    assert [p.name for p in list_checkpoints(run)] == [
        "step_00000001",
        "step_00000002",
        "step_00000003",
    ]


# ---------------------------------------------------------------- metrics.jsonl


def test_a_corrupt_metrics_line_drops_nothing_after_it(tmp_path, capsys):
    run = tmp_path / "run"
    data = tiny_config(run, train={"steps": 4}, log={"checkpoint_every": 2, "eval_size": 0})
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"  # step 1, cut in the middle
    (run / "metrics.jsonl").write_text("".join(lines))
    capsys.readouterr()
    assert [r["step"] for r in read_metrics(run)] == [0, 2, 3]
    err = capsys.readouterr().err
    assert "metrics.jsonl line 2" in err and len(err.strip().splitlines()) == 1
    # report shows every valid row
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["run"]["steps"] == 3
    # resume from step 4: rows before it are kept (the corrupt line alone is dropped)
    assert (
        main(["train", "--config", str(cfg_path), "--no-progress", "--resume", "train.steps=6"])
        == 0
    )
    assert [r["step"] for r in read_metrics(run)] == [0, 2, 3, 4, 5]
    assert "metrics.jsonl line 2" in capsys.readouterr().err


def test_resume_truncates_only_rows_past_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    data = tiny_config(run, train={"steps": 3}, log={"checkpoint_every": 2, "eval_size": 0})
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(data))
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    # as a kill before the step-3 checkpoint leaves it: rows 0-2, checkpoint at step 2
    ck.shutil.rmtree(run / "checkpoints" / "step_00000003")
    first = read_metrics(run)
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[:2] == first[:2]
