"""Fault suite: a sweep owns its processes (issue 35). Its workers exit when the sweep dies,
and one worker's death fails only the run it held, named by that run; the others go on.
Workers are found by the pid in their run folder's lock (train/run_folder.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from _sweep_process import start_sweep
from fp8rl.errors import Fp8rlError
from fp8rl.study.sweep import runner
from fp8rl.study.sweep.spec import run_dir
from fp8rl.study.sweep.workers import _died
from helpers_config import tiny_config

LONG = 100_000  # steps: a run that is still training whenever the test acts


def _spec(tmp_path) -> dict:
    base = tiny_config(tmp_path / "unused", train={"steps": 2}, log={"eval_size": 0})
    # the long run costs most: it starts first, the short one waits for the one job
    return {"base": base, "arms": {"long": {"train": {"steps": LONG}}, "short": {}}, "seeds": [0]}


def _training_worker(folder: Path, sweep_pid: int, deadline: float) -> int:
    """The pid of the worker training in `folder` once it has logged a step."""
    while time.monotonic() < deadline:
        try:
            pid = json.loads((folder / ".lock").read_text())["pid"]
            if pid != sweep_pid and (folder / "metrics.jsonl").read_text().strip():
                return pid
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no worker trained in {folder} in time")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state  # a zombie has exited


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_exit_when_the_sweep_is_killed(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(_spec(tmp_path)))
    out = tmp_path / "out"
    parent = start_sweep(spec_path, out)
    worker = None
    try:
        worker = _training_worker(run_dir(out, "long", 0), parent.pid, time.monotonic() + 240)
        parent.kill()  # the sweep alone; its worker is not told
        parent.wait()
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker trains on after its sweep died"  # was: it did
    finally:
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_dead_worker_fails_only_its_run_and_names_it(tmp_path):
    out = tmp_path / "out"
    killed = []

    def kill_the_long_run():
        pid = _training_worker(run_dir(out, "long", 0), os.getpid(), time.monotonic() + 240)
        os.kill(pid, signal.SIGKILL)  # as the out-of-memory killer would
        killed.append(pid)

    killer = threading.Thread(target=kill_the_long_run, daemon=True)
    killer.start()
    with pytest.raises(Fp8rlError) as e:
        runner.run_sweep(_spec(tmp_path), out, jobs=1, progress=False)
    killer.join()
    message = str(e.value)
    assert killed and message.startswith(
        "run long seed 0 failed: its worker process died (SIGKILL)"
    )
    assert "long/seed-0/worker.log" in message and "more failed" not in message
    # the queued run went on (was: it failed too, with the pool the dead worker broke)
    done = json.loads((run_dir(out, "short", 0) / "done.json").read_text())
    assert (done["arm"], done["steps"]) == ("short", 2)
    assert not (run_dir(out, "long", 0) / "done.json").exists()


def test_how_a_worker_s_end_is_worded():
    class Ended:
        def __init__(self, code):
            self.exitcode = code

    assert _died(Ended(-9)) == "its worker process died (SIGKILL)"
    assert _died(Ended(1)) == "its worker process exited with code 1 before it reported"
