"""Faults of sweep folders and of `fp8rl report`'s inputs. The sweep deletes only an unfinished
attempt of its own; any other run folder it needs moves to RUN/.old-<time>/ byte for byte.
`report` names every run given (no two collide) and no row content reaches the user as a
traceback: a malformed row is skipped with a warning naming the file and line, steps out of
order are a one-line error."""

import json

import pytest
import yaml

from fp8rl.cli import main
from fp8rl.errors import Fp8rlError
from fp8rl.study.report import make_report
from fp8rl.study.sweep import runner
from helpers_config import tiny_config
from helpers_runs import snapshot

# ---------------------------------------------------------------- sweep folders


def _spec(tmp_path) -> dict:
    base = tiny_config(tmp_path / "unused", train={"steps": 2})
    return {"base": base, "arms": {"a": {}}, "seeds": [0]}


def _clear_only(monkeypatch, spec, out, **kw) -> list:
    """run_sweep up to its workers: which runs it would start, after it made room for them."""
    started = []

    def no_workers(pending, *args):
        started.extend(pending)
        return []

    monkeypatch.setattr(runner, "_execute", no_workers)
    with pytest.raises(Fp8rlError, match="not complete"):  # no worker ran: nothing to aggregate
        runner.run_sweep(spec, out, progress=False, jobs=1, **kw)  # no default-jobs notice
    return started


def _archives(folder):
    return sorted(p for p in folder.iterdir() if p.name.startswith(".old-"))


def test_a_finished_train_run_in_a_sweep_folder_moves_aside_byte_for_byte(
    tmp_path, monkeypatch, capsys
):
    spec, out = _spec(tmp_path), tmp_path / "out"
    folder = out / "a" / "seed-0"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_config(folder, log={"checkpoint_every": 1})))
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    assert (folder / "final.json").is_file() and (folder / "checkpoints").is_dir()
    before = snapshot(folder)
    capsys.readouterr()

    assert _clear_only(monkeypatch, spec, out) == [("a", 0)]
    (old,) = _archives(folder)
    assert [p.name for p in folder.iterdir()] == [old.name]  # no final.json beside a new run
    assert snapshot(old) == before  # rows, checkpoints, config, final.json: all kept
    notices = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(notices) == 1 and "warning" in notices[0], notices
    assert str(folder) in notices[0] and str(old) in notices[0] and "worker.log" in notices[0]


# what one attempt of the sweep writes before done.json (all of it, to be cleared)
ATTEMPT = {
    "worker.log": "Traceback: killed\n",
    "metrics.jsonl": '{"step": 0}\n',
    "responses.jsonl": '{"step": 0, "len": 3}\n',
    "events.log": "step 0: surge\n",
    "config.json": "{}",
    "fp8_conversion.txt": "4 layers",
    "checkpoints/step_00000001/state.json": "{}",
    "checkpoints/.tmp-00000002-x/model.safetensors": "half",
    "checkpoints/corrupt/step_00000003/state.json": "{}",
    "tensorboard/events.out": "tb",
    "wandb/run-1/files.txt": "wb",
}


def _fill(folder, files: dict) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


@pytest.mark.parametrize(
    "extra, overwrite, moved, needle",
    [
        ({}, False, False, None),  # the sweep's own unfinished attempt: every file cleared
        ({"final.json": "{}"}, False, True, "final.json"),  # someone else's file in it
        ({"notes.txt": "mine"}, False, True, "notes.txt"),
        ({"done.json": "{}"}, True, True, "--overwrite"),  # a finished run, rerun
    ],
    ids=["own-attempt", "stale-final-json", "user-file", "overwrite-finished"],
)
def test_the_sweep_deletes_only_its_own_unfinished_attempts(
    tmp_path, monkeypatch, capsys, extra, overwrite, moved, needle
):
    spec, out = _spec(tmp_path), tmp_path / "out"
    folder = out / "a" / "seed-0"
    _fill(folder, {**ATTEMPT, **extra})
    earlier = folder / ".old-20240101-000000"  # an archive of an earlier --overwrite: kept
    _fill(earlier, {"metrics.jsonl": '{"step": 0}\n'})
    before, kept = snapshot(folder), snapshot(earlier)

    assert _clear_only(monkeypatch, spec, out, overwrite=overwrite) == [("a", 0)]
    archives = _archives(folder)
    assert [p.name for p in folder.iterdir() if p not in archives] == []  # nothing stale left
    assert snapshot(earlier) == kept
    notices = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    if not moved:
        assert archives == [earlier] and notices == []
        return
    (new,) = [p for p in archives if p != earlier]
    assert snapshot(new) == {k: v for k, v in before.items() if not k.startswith(".old-")}
    assert len(notices) == 1 and str(new) in notices[0] and needle in notices[0], notices


# ---------------------------------------------------------------- report inputs


def _rows(folder, lines: list) -> object:
    """RUN/metrics.jsonl of `lines` (dicts as JSON, strings as they are)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _good(step, reward):
    return {"step": step, "rollout/reward": reward, "time/wall_step": 0.5}


def _report(capsys, runs, out) -> tuple[int, dict | None, list[str]]:
    rc = main(["report", *map(str, runs), "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert not any("Traceback" in ln for ln in err), err
    summary = json.loads((out / "report.json").read_text()) if rc == 0 else None
    return rc, summary, err


def test_report_names_runs_by_their_path_below_the_common_parent(tmp_path, capsys):
    # the sweep's own layout: two runs with the same base name
    a, b = tmp_path / "out" / "a" / "seed-0", tmp_path / "out" / "b" / "seed-0"
    _rows(a, [_good(0, 1.0), _good(1, 3.0)])
    _rows(b, [_good(0, 0.0), _good(1, 0.5)])
    rc, summary, _ = _report(capsys, [a, b], tmp_path / "rep")
    assert rc == 0 and list(summary) == ["a/seed-0", "b/seed-0"]
    assert (
        summary["a/seed-0"]["reward_final"] == 2.0 and summary["b/seed-0"]["reward_final"] == 0.25
    )
    assert "| a/seed-0 |" in (tmp_path / "rep" / "report.md").read_text()
    # runs at different depths, and a single run (its base name)
    c = tmp_path / "out" / "c"
    _rows(c, [_good(0, 5.0)])
    rc, summary, _ = _report(capsys, [c, a], tmp_path / "rep2")
    assert rc == 0 and list(summary) == ["c", "a/seed-0"] and summary["c"]["reward_final"] == 5.0
    rc, summary, _ = _report(capsys, [b], tmp_path / "rep3")
    assert rc == 0 and list(summary) == ["seed-0"]
    # one folder twice (also spelled differently) would be one run shown as two
    rc, _, err = _report(
        capsys, [a, tmp_path / "out" / "b" / ".." / "a" / "seed-0"], tmp_path / "r4"
    )
    assert rc == 2 and len(err) == 1 and "twice" in err[0] and str(a) in err[0], err
    with pytest.raises(Fp8rlError, match="names"):
        make_report([a, b], tmp_path / "r5", names=["x", "x"])


@pytest.mark.parametrize(
    "bad",
    [
        {"step": 2, "rollout/reward": "high"},  # a string where a number is read
        {"step": 2, "rollout/reward": 3.0, "time/wall_step": "1s"},
        {"step": 2, "rollout/reward": [3.0]},
        {"step": 2, "rollout/reward": True},
        {"step": 2, "eval/mean@1": {"k": 1}},
        {"step": True, "rollout/reward": 3.0},
        {"step": 2.0, "rollout/reward": 3.0},
        {"step": -2, "rollout/reward": 3.0},
        '{"step": 1' + "0" * 400 + ', "rollout/reward": 3.0}',
        '{"step": 2, "rollout/reward": 1' + "0" * 400 + "}",  # overflows a float
        '{"step": 2, "rollout/reward": 1' + "0" * 5000 + "}",  # over Python's int-parse limit
        '{"step": 2, "x": ' + "[" * 100000 + "]" * 100000 + "}",  # nested past the recursion limit
        "[1, 2]",
        '{"step": 2, "rollout/reward": 3.',
    ],
    ids=[
        "reward-string",
        "wall-string",
        "reward-list",
        "reward-bool",
        "eval-dict",
        "step-bool",
        "step-float",
        "step-negative",
        "step-huge",
        "int-overflow",
        "int-too-long",
        "deep-nesting",
        "not-an-object",
        "cut-line",
    ],
)
def test_a_malformed_row_is_skipped_with_a_warning_naming_file_and_line(tmp_path, capsys, bad):
    path = _rows(tmp_path / "run", [_good(0, 1.0), _good(1, 2.0), bad, _good(3, 4.0)])
    rc, summary, err = _report(capsys, [tmp_path / "run"], tmp_path / "rep")
    assert rc == 0, err
    assert len(err) == 1 and "warning" in err[0] and f"{path} line 3" in err[0], err
    run = summary["run"]
    assert run["steps"] == 3 and run["reward_final"] == pytest.approx(7 / 3)
    assert run["wall_s"] == 1.5 and not any(k.startswith("eval_") for k in run)


def test_non_finite_values_count_as_missing_and_report_json_stays_strict(tmp_path, capsys):
    lines = [_good(0, 1.0), '{"step": 1, "rollout/reward": NaN, "time/wall_step": Infinity}']
    lines.append('{"step": 2, "rollout/reward": 3.0, "eval/mean@1": NaN}')
    _rows(tmp_path / "run", lines)
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.json").read_text()
    run = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in report.json"))["run"]
    assert run["steps"] == 3 and run["reward_final"] == 2.0 and run["wall_s"] == 0.5
    assert run["eval_mean@1"] is None


@pytest.mark.parametrize(
    "steps, line", [([0, 1, 1, 2], 3), ([0, 2, 1], 3), ([0, 0, 1, 1], 2)], ids=str
)
def test_steps_out_of_order_are_a_one_line_error(tmp_path, capsys, steps, line):
    # two runs interleaved in one file, or a resume gone wrong: no row is the right one to keep
    path = _rows(tmp_path / "run", [_good(s, 1.0) for s in steps])
    rc, _, err = _report(capsys, [tmp_path / "run"], tmp_path / "rep")
    assert rc == 2 and len(err) == 1 and err[0].startswith("fp8rl report: error:"), err
    assert f"{path} line {line}" in err[0] and f"step {steps[line - 1]}" in err[0]
    assert not (tmp_path / "rep").exists()  # checked before anything is written


def test_a_run_folder_a_live_train_holds_is_refused_before_the_sweep_writes(tmp_path, monkeypatch):
    """A sweep rerunning a folder in which `fp8rl train` is still running (no done.json yet)
    would move that run's files away under it: refused, naming the holder, nothing touched."""
    import subprocess
    import sys

    spec, out = _spec(tmp_path), tmp_path / "out"
    folder = out / "a" / "seed-0"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from fp8rl.train import run_folder; "
            "run_folder.acquire(sys.argv[1], 'fp8rl train'); print('held', flush=True); "
            "time.sleep(120)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        monkeypatch.setattr(runner, "_execute", lambda *a: pytest.fail("no run may start"))
        with pytest.raises(Fp8rlError, match=rf"pid {holder.pid}"):
            runner.run_sweep(spec, out, progress=False)
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_report_of_a_one_step_run_draws_no_empty_plot_and_warns_nothing(tmp_path):
    """Was: a matplotlib legend warning and empty plots (those leaving step 0 out)."""
    import warnings

    from fp8rl.study.report import PLOTS, plot_runs

    row = {"step": 0, **{key: 0.5 for *_, keys, _ in PLOTS for key, _ in keys}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = plot_runs({"run": [row]}, tmp_path)
    drawn = {fname for fname, *_, skip0 in PLOTS if not skip0}
    assert {p.name for p in written} == drawn and drawn
    assert len(drawn) < len(PLOTS)  # some plots leave step 0 out: the case this checks
