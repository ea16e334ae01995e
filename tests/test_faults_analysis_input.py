"""Fault suite: the analysis tools' input (issue 35). Every tool that turns runs into a claim
(the sweep's aggregation, sweep.phase, arm_table, response_entropy, long_verdict, export_runs,
scripts/rerun_check.py, a sweep rerun) checks what it reads first: a run without rows, with
fewer rows than its done.json counts, an all-NaN window or too few seeds or steps is an error or
an explicit "no verdict" naming the run and the rule; a damaged or unwritable file is one line
naming it. Constructed sweeps on disk, no training."""

from __future__ import annotations

import errno
import gzip
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fp8rl.errors import Fp8rlError
from fp8rl.study import arm_table, export_runs, long_verdict, response_entropy
from fp8rl.study.sweep import phase, runner
from fp8rl.study.sweep.aggregation import aggregate
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_configs, run_dir
from helpers_config import tiny_config
from helpers_scripts import load_script

STEPS, W = 20, 5  # the cell and verdict rules need final_window + 10 = 15 steps
ARMS = ("bf16", "fp8", "fp8-calibrated")


def _row(step: int, reward: float = 0.3) -> dict:
    return {
        "step": step,
        "rollout/reward": reward,
        "rollout/entropy": 0.3,
        "rollout/malformed_frac": 0.0,
        "rollout/response_len": 40.0,
    }


def _write_sweep(out: Path, seeds=(0, 1, 2), steps: int = STEPS, arms=ARMS) -> None:
    """A finished sweep: every run logs `steps` rows, reward 0.3 + 0.01 * seed index."""
    spec = load_spec({"base": {}, "arms": {a: {} for a in arms}, "seeds": list(seeds)})
    spec = load_spec({**spec.to_dict(), "final_window": W})
    out.mkdir(parents=True)
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm in arms:
        for i, seed in enumerate(seeds):
            folder = run_dir(out, arm, seed)
            folder.mkdir(parents=True)
            rows = [_row(s, 0.3 + 0.01 * i) for s in range(steps)]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (folder / "config.json").write_text(json.dumps({"train": {"steps": steps}}))
            done = {"steps": steps, "wall_s": 1.0, "eval_final": {"eval/mean@1": 0.5}}
            (folder / "done.json").write_text(json.dumps(done))


def _rewrite(folder: Path, change) -> None:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rows = change(rows)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _no_nan_reward_at_end(rows):
    for r in rows[-W:]:
        r["rollout/reward"] = float("nan")
    return rows


# ---------------------------------------------------------------- the sweep's aggregation


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        # every row gone: once an aggregate with reward_final null for that seed
        (lambda f: (f / "metrics.jsonl").write_text(""), "no metrics row for step 0"),
        # rows cut at step 12: once the seed's means over 12 steps
        (lambda f: _rewrite(f, lambda r: r[:12]), "no metrics row for step 12 of 20"),
        # the last final_window rewards NaN: once reward_final null, n = 2 of 3 seeds
        (lambda f: _rewrite(f, _no_nan_reward_at_end), "no finite rollout/reward in its last 5"),
        # done.json counts more steps than the rows hold (config.json says fewer)
        (lambda f: _config_says_12(f), "done.json counts 20 steps, its metrics hold 12 rows"),
        # damaged files: once a JSONDecodeError or a gzip traceback
        (lambda f: (f / "done.json").write_text('{"steps": 2'), "done.json is damaged"),
        (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json is damaged"),
        (lambda f: _gzip_then_cut(f), "cannot read"),
    ],
    ids=["no-rows", "short", "nan-window", "done-counts-more", "bad-done", "bad-config", "bad-gz"],
)
def test_the_aggregation_refuses_missing_short_nan_or_damaged_runs(tmp_path, damage, says):
    out = tmp_path / "sweep"
    _write_sweep(out)
    folder = run_dir(out, "fp8", 1)
    damage(folder)
    with pytest.raises(Fp8rlError, match=says) as e:
        aggregate(out / SPEC_FILE, out)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)
    assert not (out / "aggregate.json").exists()


def _config_says_12(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps({"train": {"steps": 12}}))
    _rewrite(folder, lambda rows: rows[:12])


def _cut_gz(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _gzip_then_cut(folder: Path) -> None:
    data = gzip.compress((folder / "metrics.jsonl").read_bytes())
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl.gz").write_bytes(data[: len(data) // 2])


def test_a_sound_sweep_still_aggregates(tmp_path):
    out = tmp_path / "sweep"
    _write_sweep(out)
    agg = aggregate(out / SPEC_FILE, out)
    assert agg["arms"]["fp8"]["final"]["reward_final"]["per_seed"] == pytest.approx(
        [0.30, 0.31, 0.32]
    )


# ---------------------------------------------------------------- sweep.phase (grid cells)


def _write_grid(out: Path, seeds, steps: int) -> None:
    grid = {"lr": {"values": {"lo": {}, "hi": {}}}}
    spec = load_spec({"base": {}, "arms": {"bf16": {}, "fp8": {}}, "seeds": list(seeds)})
    spec = load_spec({**spec.to_dict(), "grid": grid, "final_window": W})
    _write_sweep(out, seeds, steps, arms=tuple(spec.arms))
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))


@pytest.mark.parametrize(
    ("seeds", "steps", "says"),
    [
        ((0,), STEPS, "1 seed(s); the choice of a cell needs at least 2"),
        ((0, 1), 12, "a run of 12 steps; the choice of a cell needs at least final_window + 10"),
    ],
)
def test_sweep_phase_chooses_no_cell_from_too_few_seeds_or_steps(
    tmp_path, capsys, seeds, steps, says
):
    out = tmp_path / "grid"
    _write_grid(out, seeds, steps)
    assert phase.main([str(out)]) == 1  # was 0 and a chosen cell
    printed = capsys.readouterr().out
    assert "No cell chosen, no verdict" in printed and says in printed
    assert json.loads((out / "cells.json").read_text())["chosen"]["cell"] is None
    assert says in (out / "cells.md").read_text()


@pytest.mark.parametrize("arm", ["", "nope"])
def test_sweep_phase_refuses_an_arm_the_spec_lacks_and_writes_nothing(tmp_path, capsys, arm):
    out = tmp_path / "grid"
    _write_grid(out, (0, 1), STEPS)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit) as e:
        phase.main([str(out), "--arm", arm])
    assert e.value.code == 2 and "is no arm of the spec" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before


def test_sweep_phase_refuses_a_nan_trajectory_and_a_damaged_done_json(tmp_path, capsys):
    out = tmp_path / "grid"
    _write_grid(out, (0, 1), STEPS)
    folder = run_dir(out, "fp8--hi", 1)

    def nan_entropy(rows):
        rows[7]["rollout/entropy"] = float("nan")
        return rows

    _rewrite(folder, nan_entropy)
    with pytest.raises(SystemExit) as e:
        phase.main([str(out)])
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and "step 7 has no finite rollout/entropy" in err and str(folder) in err
    )
    _rewrite(folder, lambda rows: [_row(r["step"]) for r in rows])
    (folder / "done.json").write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit):
        phase.main([str(out)])
    err = capsys.readouterr().err
    assert f"{folder / 'done.json'} is damaged" in err and "Traceback" not in err
    assert not (out / "cells.json").exists()


# ---------------------------------------------------------------- arm_table


def _agg(per_seed: dict, seeds=(0, 1, 2)) -> dict:
    return {
        "arms": {
            a: {"seeds": list(seeds), "final": {"reward_final": {"per_seed": v}}, "metrics": {}}
            for a, v in per_seed.items()
        }
    }


def test_arm_table_refuses_a_seed_missing_among_the_others(tmp_path, capsys):
    agg = _agg({"bf16": [0.5, 0.6, 0.7], "fp8": [0.4, None, 0.65]})
    (tmp_path / "aggregate.json").write_text(json.dumps(agg))
    with pytest.raises(SystemExit) as e:
        arm_table.main([str(tmp_path)])  # was a table of fp8 over 2 seeds, paired over 2
    err = capsys.readouterr().err
    assert e.value.code == 2 and "arm fp8: reward_final has no value for seed(s) [1]" in err


def test_arm_table_pairs_no_single_seed(tmp_path, capsys):
    (tmp_path / "aggregate.json").write_text(json.dumps(_agg({"bf16": [0.5], "fp8": [0.4]}, [0])))
    assert arm_table.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| reward, last 10 steps | 0.500 | 0.400 |" in out
    # was "| reward, last 10 steps | - | -0.100 |": a paired "difference" of one seed
    assert "minus `bf16`: no verdict, 1 seed(s); a paired difference needs at least 2" in out
    assert "-0.100" not in out


def test_arm_table_reads_its_sweep_s_runs_and_a_damaged_aggregate_is_one_line(tmp_path, capsys):
    out = tmp_path / "sweep"
    _write_sweep(out)
    agg = aggregate(out / SPEC_FILE, out)
    assert arm_table.main([str(out)]) == 0
    capsys.readouterr()
    _rewrite(run_dir(out, "bf16", 2), lambda rows: rows[:3])  # a run cut after its aggregate
    with pytest.raises(SystemExit):
        arm_table.main([str(out)])
    assert "no metrics row for step 3 of 20" in capsys.readouterr().err
    (out / "aggregate.json").write_text(json.dumps(agg)[:40])
    shutil.rmtree(run_dir(out, "bf16", 2))
    (out / SPEC_FILE).unlink()
    with pytest.raises(SystemExit):
        arm_table.main([str(out)])
    err = capsys.readouterr().err
    assert "aggregate.json is damaged: not valid JSON" in err and "Traceback" not in err


def test_arm_table_of_committed_raw_runs_computes_the_aggregate_and_writes_nothing(
    tmp_path, capsys
):
    out = tmp_path / "raw"
    _write_sweep(out)  # spec.json and the runs, no aggregate.json: what export_runs commits
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert arm_table.main([str(out)]) == 0  # was: "aggregate.json not found"
    table = capsys.readouterr().out
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    swept = shutil.copytree(out, tmp_path / "swept")  # the same runs, as a sweep leaves them
    aggregate(swept / SPEC_FILE, swept)
    assert arm_table.main([str(swept)]) == 0
    assert capsys.readouterr().out == table
    _rewrite(run_dir(out, "bf16", 2), lambda rows: rows[:3])
    with pytest.raises(SystemExit):
        arm_table.main([str(out)])
    assert "no metrics row for step 3 of 20" in capsys.readouterr().err


# ---------------------------------------------------------------- response_entropy


def _responses(folder: Path, rows: list[dict], loss=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"loss": loss or {}, "train": {"steps": 3}}))
    (folder / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _resp(step, entropy, adv, clipped):
    return {"step": step, "entropy": entropy, "adv": adv, "lower_clip_fp8": clipped}


def test_response_entropy_refuses_a_seed_with_nothing_to_compare(tmp_path, capsys):
    good = [_resp(1, 1.0, -1, True), _resp(1, 2.0, -1, False)]
    _responses(tmp_path / "fp8" / "seed-0", good)
    # only step 0 and positive advantages: once NaN stats, dropped from the means silently
    _responses(tmp_path / "fp8" / "seed-1", [_resp(0, 1.0, -1, True), _resp(2, 1.0, 1, False)])
    assert response_entropy.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fp8/seed-1: no negative-advantage response at steps >= 1" in err
    _responses(tmp_path / "fp8" / "seed-1", [_resp(1, float("nan"), -1, True)])
    assert response_entropy.main([str(tmp_path)]) == 2
    assert "a response of step 1 has no finite entropy" in capsys.readouterr().err
    _responses(tmp_path / "fp8" / "seed-1", good)
    (tmp_path / "fp8" / "seed-0" / "config.json").write_text("{")
    assert response_entropy.main([str(tmp_path)]) == 2  # was a JSONDecodeError traceback
    err = capsys.readouterr().err
    assert "seed-0/config.json is damaged" in err and "Traceback" not in err


def test_response_entropy_of_a_sweep_needs_every_run_s_responses(tmp_path, capsys):
    out = tmp_path / "sweep"
    _write_sweep(out, seeds=(0, 1), arms=("fp8",))
    for seed in (0, 1):
        _responses(run_dir(out, "fp8", seed), [_resp(1, 1.0, -1, True), _resp(1, 2.0, -1, False)])
        (run_dir(out, "fp8", seed) / "config.json").write_text(
            json.dumps({"loss": {}, "train": {"steps": STEPS}})
        )
    assert response_entropy.main([str(out)]) == 0
    capsys.readouterr()
    (run_dir(out, "fp8", 1) / "responses.jsonl").unlink()  # was: seed 1 left out silently
    assert response_entropy.main([str(out)]) == 2
    assert "fp8/seed-1: no responses.jsonl" in capsys.readouterr().err
    (run_dir(out, "fp8", 1) / "done.json").unlink()
    assert response_entropy.main([str(out)]) == 2
    assert "not finished" in capsys.readouterr().err


# ---------------------------------------------------------------- long_verdict


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: (f / "done.json").write_text("{"), "done.json is damaged"),
        (lambda f: (f / "config.json").write_text("nul"), "config.json is damaged"),
        (lambda f: _gzip_then_cut(f), "metrics.jsonl.gz: Compressed file ended"),
        (
            lambda f: (f / "done.json").write_text(json.dumps({"steps": STEPS + 5})),
            f"done.json counts {STEPS + 5} steps, its metrics hold {STEPS} rows",
        ),
    ],
    ids=["bad-done", "bad-config", "cut-gz", "done-counts-more"],
)
def test_long_verdict_on_damaged_files_is_one_line_and_no_verdict(tmp_path, capsys, damage, says):
    out = tmp_path / "sweep"
    _write_sweep(out)
    folder = run_dir(out, "fp8", 2)
    damage(folder)
    with pytest.raises(SystemExit) as e:
        long_verdict.main([str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and str(folder) in err and "Traceback" not in err
    last = err.strip().splitlines()[-1]  # argparse's usage lines, then the one error line
    assert last.startswith("python -m fp8rl.study.long_verdict: error: ") and says in last
    assert not (out / "verdict.json").exists()


# ---------------------------------------------------------------- export_runs


def test_export_reads_every_file_before_it_writes_one(tmp_path, capsys):
    src, raw = tmp_path / "sweep", tmp_path / "raw"
    _write_sweep(src)
    assert export_runs.main([str(src), str(raw)]) == 0
    _cut_gz(run_dir(raw, "bf16", 0) / "metrics.jsonl.gz")  # an export with a cut gzip stream
    again = tmp_path / "again"
    with pytest.raises(SystemExit) as e:
        export_runs.main([str(raw), str(again)])  # was: the cut file copied as it is
    err = capsys.readouterr().err
    assert e.value.code == 2 and "bf16/seed-0/metrics.jsonl.gz" in err and not again.exists()
    (run_dir(src, "fp8", 1) / "done.json").write_text("{,}")
    with pytest.raises(SystemExit):
        export_runs.main([str(src), str(again)])  # was: the damaged done.json copied
    assert "fp8/seed-1/done.json is damaged" in capsys.readouterr().err and not again.exists()


def test_export_into_a_file_or_onto_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    src, blocked = tmp_path / "sweep", tmp_path / "a-file"
    _write_sweep(src)
    blocked.write_text("not a folder")
    with pytest.raises(SystemExit) as e:
        export_runs.main([str(src), str(blocked)])  # was: a FileExistsError traceback
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"cannot write the export file {blocked}" in err
    assert blocked.read_text() == "not a folder"

    def full(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(export_runs, "atomic_write_bytes", full)
    with pytest.raises(SystemExit):
        export_runs.main([str(src), str(tmp_path / "raw")])
    err = capsys.readouterr().err
    assert "raw/spec.json: No space left on device (errno 28)" in err and "Traceback" not in err


# ---------------------------------------------------------------- scripts/rerun_check.py


def _rerun_check():
    return load_script("rerun_check")


def _committed(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"train": {"steps": 3}, "log": {}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "done.json").write_text(json.dumps({"steps": len(rows)}))


def test_rerun_check_that_compares_nothing_fails(tmp_path, capsys, monkeypatch):
    check = _rerun_check()
    monkeypatch.setattr(check, "rerun", lambda cfg, steps, tmp: pytest.fail("nothing to rerun"))
    run = tmp_path / "run"
    _committed(run, [])
    assert check.main([str(run)]) == 2  # was: a rerun, then "0 values, 0 differ", exit 0
    assert "no metrics row for step 0 of 3" in capsys.readouterr().err
    (run / "config.json").write_text("{")
    assert check.main([str(run)]) == 2  # was: a JSONDecodeError traceback
    assert f"{run / 'config.json'} is damaged" in capsys.readouterr().err
    # rows that hold wall times only: the rerun matches them all and compares no value
    timed = tmp_path / "timed"
    _committed(timed, [{"step": s, "time/wall_step": 1.0} for s in range(3)])
    monkeypatch.setattr(check, "rerun", lambda cfg, steps, tmp: [{"step": s} for s in range(3)])
    assert check.main([str(timed)]) == 1
    captured = capsys.readouterr()
    assert "0 values, 0 differ" in captured.out and "nothing was compared" in captured.err
    assert check.main([str(timed), "--steps", "4"]) == 2
    assert "--steps 4: the run has 3 steps" in capsys.readouterr().err


# ---------------------------------------------------------------- a sweep rerun


@pytest.mark.parametrize("name", ["done.json", "config.json"])
def test_a_sweep_rerun_over_a_damaged_done_or_config_json_is_one_line(
    tmp_path, capsys, monkeypatch, name
):
    from fp8rl.cli import main

    spec = {"base": tiny_config(tmp_path / "unused"), "arms": {"a": {}}, "seeds": [0]}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    folder = run_dir(tmp_path / "out", "a", 0)
    folder.mkdir(parents=True)
    (folder / "done.json").write_text(json.dumps({"steps": 2}))
    config = run_configs(load_spec(spec), tmp_path / "out")["a", 0].to_dict()
    (folder / "config.json").write_text(json.dumps(config))  # the run's own: no mismatch
    (folder / name).write_text('{"steps": 2')  # cut by a crash or a full disk
    monkeypatch.setattr(runner, "_execute", lambda *a: pytest.fail("no run may start"))
    code = main(["sweep", str(spec_path), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err  # was: a JSONDecodeError traceback
    assert f"{folder / name} is damaged: not valid JSON" in err[0] and "--overwrite" in err[0]
