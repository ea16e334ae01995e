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

ROWS = [{"step": s, "actor/loss": 0.125 * s, "note": "x" * 40} for s in range(6)]


def _write_rows(run, name="metrics.jsonl"):
    run.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    (run / name).write_text(text)
    return text


# a child that rewrites RUN/NAME for a resume at step 4 (rows 0-3 kept) under a fault
_REWRITE = """
import io, builtins, os, resource, signal, sys
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
except OSError as e:
    print("oserror", e.errno, flush=True)
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


def test_a_file_size_limit_during_the_resume_rewrite_keeps_every_row(tmp_path):
    run = tmp_path / "run"
    text = _write_rows(run)
    kept = "".join(json.dumps(r) + "\n" for r in ROWS[:4])
    # the limit lets the rewrite start but not finish: a truncating rewrite loses rows 2-5
    limit = len(kept) // 2
    proc = _rewrite_under(run, "metrics.jsonl", str(limit))
    assert proc.returncode == 3 and "oserror 27" in proc.stdout, (proc.stdout, proc.stderr)
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
    from test_train_loop import tiny_config

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
