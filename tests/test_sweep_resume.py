"""A sweep killed in the middle of a run resumes that run from its newest intact checkpoint
(not from step 0) and ends with the aggregate an uninterrupted sweep gives."""

import json
import os
import signal
import time

import yaml

from _sweep_process import start_sweep
from fp8rl.study.sweep import runner
from fp8rl.train import run_folder
from fp8rl.train.runlog import read_metrics
from helpers_config import tiny_config

STEPS = 8


def _spec(tmp_path) -> dict:
    base = tiny_config(
        tmp_path / "unused",
        train={"steps": STEPS},
        # every file a run may write: a resume must recognise all of them as its own
        log={"checkpoint_every": 2, "eval_size": 0, "samples": 2, "response_stats": True},
    )
    return {"base": base, "arms": {"a": {}}, "seeds": [0]}


def _without_times(agg):
    """The aggregate less wall-clock times (an interrupted run's differ by nature)."""
    if isinstance(agg, dict):
        return {
            k: _without_times(v) for k, v in agg.items() if not k.startswith(("wall_s", "time/"))
        }
    if isinstance(agg, list):
        return [_without_times(v) for v in agg]
    return agg


def _kill_after_a_checkpoint(spec_path, out):
    """`fp8rl sweep` in its own process group, SIGKILLed (parent and worker) once the run has
    written its second checkpoint and before it has finished."""
    proc = start_sweep(spec_path, out)
    ckpt = out / "a" / "seed-0" / "checkpoints" / "step_00000004"
    deadline = time.monotonic() + 240
    while not ckpt.is_dir():
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the worker is not our child: on a loaded machine it may still be exiting, holding the
    # run folder's lock; the kernel drops it when the worker is gone
    with run_folder.held(out / "a" / "seed-0", "the test", wait=True):
        pass


def test_a_killed_sweep_resumes_its_run_from_the_checkpoint(tmp_path):
    spec = _spec(tmp_path)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "killed"
    _kill_after_a_checkpoint(spec_path, out)
    folder = out / "a" / "seed-0"
    assert not (folder / "done.json").exists()
    before = read_metrics(folder)
    assert 4 <= len(before) < STEPS  # killed mid-run, after the step-4 checkpoint
    assert (folder / "samples.jsonl").stat().st_size > 0

    agg = runner.run_sweep(spec, out, jobs=1, progress=False)
    rows = read_metrics(folder)
    assert [r["step"] for r in rows] == list(range(STEPS))
    # the steps up to the checkpoint were kept, not rerun (their wall times are the first's)
    kept = [r for r in before if r["step"] < 4]
    assert rows[:4] == kept
    done = json.loads((folder / "done.json").read_text())
    assert done["resumed_at"] in (4, 6) and done["steps"] == STEPS
    assert f"step {done['resumed_at']}: resumed from" in (folder / "events.log").read_text()
    assert not list(folder.glob(".old-*"))  # nothing of the attempt was taken for foreign

    whole = runner.run_sweep(spec, tmp_path / "whole", jobs=1, progress=False)
    assert _without_times(agg) == _without_times(whole)


def test_a_sweep_run_without_an_intact_checkpoint_starts_over(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    folder = tmp_path / "out" / "a" / "seed-0"
    folder.mkdir(parents=True)
    (folder / "worker.log").write_text("killed before its first checkpoint\n")
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    started = []
    monkeypatch.setattr(runner, "_execute", lambda pending, *a: started.append(a[-1]) or [])
    try:
        runner.run_sweep(spec, tmp_path / "out", jobs=1, progress=False)
    except Exception:  # no run finished: nothing to aggregate
        pass
    assert started == [set()]  # nothing to resume
    assert not (folder / "metrics.jsonl").exists()  # the attempt was cleared
