"""Faults of a run folder's own files: rewrites of metrics.jsonl are atomic (a kill or a full
disk during one keeps every earlier row), one process at a time holds a run folder (a second
trainer, resume, sweep or warm-start builder is refused naming the holder's pid, a stale lock
of a killed process is taken over), and final.json covers the whole run after a resume."""

import json
import os
import signal
import subprocess
import sys

import pytest

from fp8rl.train.runlog import read_metrics
from helpers_runs import snapshot

ROWS = [{"step": s, "actor/loss": 0.125 * s, "note": "x" * 40} for s in range(6)]


def _write_rows(run, name="metrics.jsonl"):
    run.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    (run / name).write_text(text)
    return text


# a child that rewrites RUN/NAME for a resume at step 4 (rows 0-3 kept) under a fault
_REWRITE = """
import io, builtins, os, resource, signal, sys
from fp8rl.errors import StorageError
from fp8rl.train.runlog import restart_jsonl
run, name, fault = sys.argv[1], sys.argv[2], sys.argv[3]
if fault == "kill":  # SIGKILL half-way through the first write to a file in the run folder
    real_open = io.open

    class Killing:
        def __init__(self, f):
            self.f = f
        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)
        def __getattr__(self, attr):
            return getattr(self.f, attr)

    def killing_open(file, mode="r", *args, **kw):
        f = real_open(file, mode, *args, **kw)
        return Killing(f) if "w" in mode and str(file).startswith(run) else f

    io.open = builtins.open = killing_open
else:  # a real file-size limit: write() fails with EFBIG (SIGXFSZ ignored)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(fault)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    restart_jsonl(run, name, 4)
except StorageError as e:  # the one-line error, naming the file, of the OSError under it
    print("oserror", e.__cause__.errno, "|", e, flush=True)
    sys.exit(3)
print("done", flush=True)
"""


def _rewrite_under(run, name, fault):
    return subprocess.run(
        [sys.executable, "-c", _REWRITE, str(run), name, fault],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", ["metrics.jsonl", "responses.jsonl"])
def test_a_kill_during_the_resume_rewrite_keeps_every_row(tmp_path, name):
    run = tmp_path / "run"
    text = _write_rows(run, name)
    proc = _rewrite_under(run, name, "kill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # it died in the write
    # the old file is whole: no row of it lost, none half-written
    assert (run / name).read_text() == text
    assert [r["step"] for r in read_metrics(run, name=name)] == list(range(6))
    assert len(list(run.glob(f".{name}.*.tmp"))) == 1  # the killed one's half-written temp
    # the next resume rewrites it and clears the temporary file left behind
    proc = _rewrite_under(run, name, str(10 * len(text)))
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_metrics(run, name=name)] == [0, 1, 2, 3]
    assert sorted(p.name for p in run.iterdir()) == [name]


def test_a_file_size_limit_during_the_resume_rewrite_keeps_every_row(tmp_path):
    run = tmp_path / "run"
    text = _write_rows(run)
    kept = "".join(json.dumps(r) + "\n" for r in ROWS[:4])
    # the limit lets the rewrite start but not finish: a truncating rewrite loses rows 2-5
    limit = len(kept) // 2
    proc = _rewrite_under(run, "metrics.jsonl", str(limit))
    assert proc.returncode == 3 and "oserror 27" in proc.stdout, (proc.stdout, proc.stderr)
    assert f"cannot write {run / 'metrics.jsonl'}: File too large" in proc.stdout
    assert (run / "metrics.jsonl").read_text() == text
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # no temporary left
    # with room enough the same child rewrites it: exactly the rows before step 4
    proc = _rewrite_under(run, "metrics.jsonl", str(10 * len(text)))
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert (run / "metrics.jsonl").read_text() == kept
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_prlimit_fsize_on_the_real_cli_resume_keeps_every_row(tmp_path):
    """`prlimit --fsize` on `fp8rl train --resume`: the rewrite of metrics.jsonl fails, every
    row of the first run stays readable."""
    import shutil

    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit on this machine")
    from helpers_config import tiny_config

    run = tmp_path / "run"
    data = tiny_config(run, train={"steps": 4}, log={"checkpoint_every": 3, "eval_size": 0})
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps(data))
    from fp8rl.cli import main

    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    shutil.rmtree(run / "checkpoints" / "step_00000004")  # as a kill before it leaves the run
    before = (run / "metrics.jsonl").read_bytes()
    # room for every other file the resume writes (config.json is the largest), not for the
    # rewritten rows 0-2: a truncating rewrite loses rows for good
    kept = len(b"".join(before.splitlines(keepends=True)[:3]))
    config = (run / "config.json").stat().st_size
    assert config < kept
    proc = subprocess.run(
        ["prlimit", f"--fsize={(config + kept) // 2}", sys.executable, "-m", "fp8rl", "train"]
        + ["--config", str(cfg_path), "--no-progress", "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode != 0, proc.stderr
    assert "metrics.jsonl" in proc.stderr or "File too large" in proc.stderr, proc.stderr
    assert (run / "metrics.jsonl").read_bytes() == before
    assert not list(run.glob(".metrics.jsonl.*"))


# ---------------------------------------------------------------- one process per run folder


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _config_file(tmp_path, run, **sections):
    from helpers_config import tiny_config

    sections.setdefault("log", {"eval_size": 0})
    path = tmp_path / f"{run.name}.json"
    path.write_text(json.dumps(tiny_config(run, **sections)))
    return path


# `fp8rl train --config argv[2]` (argv[4:] its flags) paused before step argv[3] at gate argv[1]
_GATED = """
import sys, time
from pathlib import Path
import fp8rl.train.trainer as tr
real, gate, at = tr.run_step, Path(sys.argv[1]), int(sys.argv[3])
def gated(ctx, step):
    if step == at:
        (gate / "waiting").touch()
        while not (gate / "go").exists():
            time.sleep(0.05)
    return real(ctx, step)
tr.run_step = gated
from fp8rl.cli import main
sys.exit(main(["train", "--config", sys.argv[2], "--no-progress", *sys.argv[4:]]))
"""


def _start_paused(script, gate, *args):
    """A child running `script` (argv: gate first), once it waits at gate/waiting."""
    import time

    gate.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(gate), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    deadline = time.monotonic() + 180
    while not (gate / "waiting").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _gated_train(cfg_path, at, gate, *flags):
    """A real `fp8rl train` process, paused before step `at` until gate/go exists."""
    return _start_paused(_GATED, gate, cfg_path, at, *flags)


def test_a_second_train_resume_or_overwrite_on_a_running_run_is_refused_naming_its_pid(
    tmp_path, capsys
):
    """Today two trainers in one new folder both exit 0 with interleaved rows, and a resume
    duplicates steps: while the first runs, each other start is a one-line error naming it."""
    from fp8rl.cli import main

    run = tmp_path / "run"
    cfg_path = _config_file(tmp_path, run, train={"steps": 3})
    first = _gated_train(cfg_path, 0, tmp_path / "gate")  # the folder is new: no row yet
    before = snapshot(run)
    assert json.loads((run / ".lock").read_text())["pid"] == first.pid
    for flags in ([], ["--resume"], ["--overwrite"]):  # this test's process is a second one
        capsys.readouterr()
        assert main(["train", "--config", str(cfg_path), "--no-progress", *flags]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("fp8rl train: error:"), (flags, err)
        assert f"pid {first.pid}" in err[0] and str(run) in err[0], (flags, err)
    assert snapshot(run) == before  # nothing of the folder changed
    (tmp_path / "gate" / "go").touch()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err  # the first was not disturbed
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]  # one writer: one seed's rows
    assert not (run / ".lock").exists()  # released at exit


def test_a_stale_lock_of_a_killed_run_is_taken_over_with_a_notice(tmp_path, capsys):
    from fp8rl.cli import main

    run = tmp_path / "run"
    cfg_path = _config_file(tmp_path, run, train={"steps": 4}, log={"checkpoint_every": 1})
    first = _gated_train(cfg_path, 2, tmp_path / "gate")
    first.kill()
    first.communicate()
    assert json.loads((run / ".lock").read_text())["pid"] == first.pid  # left behind
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "lock" in ln]
    assert len(err) == 1 and err[0].startswith("fp8rl: warning: took over the stale lock"), err
    assert f"pid {first.pid}" in err[0]
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]
    assert not (run / ".lock").exists()


def _lock_is_held_by_me(run):
    """RUN/.lock names this process and another open file cannot lock it (flock is per open
    file, so this holds within one process too)."""
    import fcntl

    assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    with open(run / ".lock") as fh:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_fit_holds_the_lock_and_releases_it_after_a_normal_end_and_an_exception(
    tmp_path, monkeypatch
):
    import fp8rl.train.trainer as tr
    from fp8rl.config import config_from_dict
    from helpers_config import tiny_config

    real, seen, run = tr.run_step, [], {}

    def checking(ctx, step):  # the step reads no config: the run folder is the test's
        _lock_is_held_by_me(run["dir"])
        seen.append(step)
        if run["dir"].name == "boom":
            raise RuntimeError("boom")
        return real(ctx, step)

    monkeypatch.setattr(tr, "run_step", checking)
    ok = tiny_config(tmp_path / "ok", name="ok", train={"steps": 1}, log={"eval_size": 0})
    run["dir"] = tmp_path / "ok"
    tr.Trainer(config_from_dict(ok)).fit()
    run["dir"] = tmp_path / "boom"
    boom = tiny_config(tmp_path / "boom", name="boom", log={"eval_size": 0})
    with pytest.raises(RuntimeError, match="boom"):
        tr.Trainer(config_from_dict(boom)).fit()
    assert seen == [0, 0]
    for name in ("ok", "boom"):
        assert not (tmp_path / name / ".lock").exists()
    assert (tmp_path / "ok" / "metrics.jsonl").is_file()  # the lock went, the run stayed


# a real warm-start builder or sweep that holds its lock, paused where it would start work
_PAUSED = """
import sys, time
from pathlib import Path
gate = Path(sys.argv[1])

def pause(*args, **kw):
    (gate / "waiting").touch()
    while not (gate / "go").exists():
        time.sleep(0.05)
    sys.exit(0)

if sys.argv[2] == "warmstart":
    from fp8rl.train import warmstart as ws
    from fp8rl.config import load_config
    ws.build_warm_start = pause
    ws.ensure_warm_start(load_config(sys.argv[3], []))
else:
    from fp8rl.study.sweep import runner
    runner.load_spec = pause
    runner.run_sweep(sys.argv[3], sys.argv[4], jobs=1)
"""


def _paused(tmp_path, *args):
    gate = tmp_path / "gate"
    return _start_paused(_PAUSED, gate, *args), gate


def test_a_second_warm_start_builder_of_one_key_is_refused_naming_the_first(tmp_path, monkeypatch):
    from fp8rl.config import load_config
    from fp8rl.errors import Fp8rlError
    from fp8rl.train import warmstart as ws

    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    cfg_path = _config_file(tmp_path, tmp_path / "run", model={"warm_start": "auto"})
    cfg = load_config(str(cfg_path), [])
    first, gate = _paused(tmp_path, "warmstart", cfg_path)
    entry = ws.cached_path(cfg).parent
    before = snapshot(entry)
    with pytest.raises(Fp8rlError, match=f"pid {first.pid}") as e:
        ws.ensure_warm_start(cfg)
    assert "\n" not in str(e.value) and "warm-start builder" in str(e.value)
    assert snapshot(entry) == before
    (gate / "go").touch()
    assert first.wait(timeout=120) == 0
    assert not list(entry.iterdir())  # its lock went with it; nothing looks cached


def test_a_second_sweep_on_one_out_is_refused_before_writing(tmp_path, capsys):
    import yaml

    from fp8rl.cli import main
    from helpers_config import tiny_config

    spec = tmp_path / "spec.yaml"
    base = tiny_config(tmp_path / "unused", log={"eval_size": 0})
    spec.write_text(yaml.safe_dump({"base": base, "arms": {"a": {}}, "seeds": [0]}))
    out = tmp_path / "out"
    first, gate = _paused(tmp_path, "sweep", spec, out)
    before = snapshot(out)
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fp8rl sweep: error:"), err
    assert f"pid {first.pid}" in err[0]
    assert snapshot(out) == before
    (gate / "go").touch()
    assert first.wait(timeout=120) == 0
    assert not out.exists()  # a sweep that wrote nothing leaves no folder behind


# ---------------------------------------------------------------- final.json covers the run


def test_a_killed_and_resumed_run_sums_up_like_an_uninterrupted_one(tmp_path, capsys):
    """final.json and the printed summary come from the whole metrics.jsonl: today a resume
    reports only its own steps ("steps": 2 of 4)."""
    import shutil

    from fp8rl.cli import main

    def untimed(summary):
        return {k: v for k, v in summary.items() if k != "wall_s"}

    run = tmp_path / "run"
    cfg_path = _config_file(
        tmp_path, run, train={"steps": 4}, log={"checkpoint_every": 2, "eval_size": 8}
    )
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    whole = json.loads((run / "final.json").read_text())
    assert whole["steps"] == 4 and "eval/mean@1" in whole
    # as a kill after step 3's row leaves the run: no step-4 checkpoint and no final.json
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    (run / "final.json").unlink()
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    assert untimed(json.loads(capsys.readouterr().out)) == untimed(printed)
    assert untimed(json.loads((run / "final.json").read_text())) == untimed(whole)
