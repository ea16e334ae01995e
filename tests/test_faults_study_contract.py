"""The input contract every study tool checks by one shared checker (study/run_checks.py,
`complete_runs`) before it computes: every run of the spec finished, made with the spec's
config (a run of another config dropped into the sweep folder is named), all of one length
(never windowed or paired over different steps); and a --ref naming no arm is an error, not
a table without its paired section."""

from __future__ import annotations

import json

import pytest

from fp8rl.study import arm_table, window_gaps
from fp8rl.study.run_checks import IncompleteRunsError, complete_runs
from fp8rl.study.sweep.aggregation import aggregate_runs
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir

STEPS = 6


def _sweep(out, steps=STEPS):
    spec = load_spec(
        {
            "base": {"train": {"steps": steps, "lr": 1e-3}},
            "arms": {"bf16": {"train": {"precision": "bf16"}}, "fp8": {}},
            "seeds": [0, 1, 2],
        }
    )
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    _write_runs(out, spec, steps)
    return spec


def _write_runs(out, spec, steps, as_written=lambda data: None):
    """Each run of the spec under `out`: its config.json (`as_written` edits the data first,
    as the run would have written it) and `steps` metrics rows."""
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        data = spec.run_data(arm, seed, out)
        as_written(data)
        (folder / "config.json").write_text(json.dumps(data))
        _rows(folder, steps, seed)


def _rows(folder, steps, seed):
    rows = [
        {"step": s, "rollout/entropy": 0.2 + 0.01 * seed, "rollout/reward": 0.3 + 0.01 * s}
        for s in range(steps)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "done.json").write_text(json.dumps({"wall_s": 1.0, "steps": steps}))


def _set(folder, key, value):
    data = json.loads((folder / "config.json").read_text())
    *section, name = key.split(".")
    (data.setdefault(section[0], {}) if section else data)[name] = value
    (folder / "config.json").write_text(json.dumps(data))


def test_a_complete_sweep_of_one_spec_passes(tmp_path):
    spec = _sweep(tmp_path / "s")
    runs = complete_runs(tmp_path / "s", spec, ("rollout/reward",))
    assert {arm: sorted(r) for arm, r in runs.items()} == {"bf16": [0, 1, 2], "fp8": [0, 1, 2]}


@pytest.mark.parametrize(
    "key,value",
    [("train.lr", 2e-3), ("train.seed", 7), ("train.precision", "fp8-rowwise"), ("name", "x")],
)
def test_a_run_of_another_config_is_named(tmp_path, key, value):
    """Was: paired and averaged with the others. `name` is free (log.*, name, paths)."""
    spec = _sweep(tmp_path / "s")
    folder = run_dir(tmp_path / "s", "bf16", 1)
    _set(folder, key, value)
    if key == "name":
        complete_runs(tmp_path / "s", spec, ())
        return
    with pytest.raises(IncompleteRunsError) as e:
        complete_runs(tmp_path / "s", spec, ())
    assert str(folder) in str(e.value) and key in str(e.value)


def test_a_yaml_number_left_a_string_is_the_number_the_run_loaded(tmp_path):
    """YAML 1.1 reads `lr: 2e-05` as the string '2e-05' and the config loader coerces it; the
    committed kv-cache sweep was refused as 'another config' over exactly that."""
    spec = load_spec(
        {
            "base": {"train": {"steps": STEPS, "lr": "2e-05"}},
            "arms": {"bf16": {"train": {"precision": "bf16"}}, "fp8": {}},
            "seeds": [0, 1, 2],
        }
    )
    out = tmp_path / "s"
    out.mkdir()

    def as_written(data):  # what config.json holds after the loader's coercion
        data["train"]["lr"] = 2e-05

    _write_runs(out, spec, STEPS, as_written)
    complete_runs(out, spec, ())
    _set(run_dir(out, "fp8", 0), "train.lr", 3e-05)
    with pytest.raises(IncompleteRunsError, match="train.lr"):
        complete_runs(out, spec, ())


def test_runs_of_different_lengths_are_refused(tmp_path):
    """Was: windowed or paired over different steps."""
    spec = _sweep(tmp_path / "s")
    folder = run_dir(tmp_path / "s", "fp8", 2)
    _set(folder, "train.steps", STEPS + 2)  # a run extended by a resume
    _rows(folder, STEPS + 2, 2)
    with pytest.raises(IncompleteRunsError, match="of one length"):
        complete_runs(tmp_path / "s", spec, ())


@pytest.mark.parametrize("tool", ["window_gaps", "arm_table"])
def test_each_tool_refuses_a_foreign_run_in_one_line(tmp_path, capsys, tool):
    _sweep(tmp_path / "s")
    _set(run_dir(tmp_path / "s", "fp8", 0), "train.lr", 5e-4)
    main = {"window_gaps": window_gaps.main, "arm_table": arm_table.main}[tool]
    args = [str(tmp_path / "s")] + (["--window", "3"] if tool == "window_gaps" else [])
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "train.lr" in err[-1] and "Traceback" not in "".join(err)


@pytest.mark.parametrize("tool", ["window_gaps", "arm_table"])
def test_a_ref_naming_no_arm_is_an_error(tmp_path, capsys, tool):
    """Was (arm_table): the table without its paired section, exit 0."""
    _sweep(tmp_path / "s")
    main = {"window_gaps": window_gaps.main, "arm_table": arm_table.main}[tool]
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "s"), "--ref", "nope"])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err


def test_window_gaps_of_one_seed_is_refused(tmp_path, capsys):
    """Was: "gaps" from one seed, with no interval and no note."""
    out = tmp_path / "s"
    spec = _sweep(out)
    data = json.loads((out / SPEC_FILE).read_text())
    (out / SPEC_FILE).write_text(json.dumps({**data, "seeds": [0]}))
    with pytest.raises(SystemExit) as e:
        window_gaps.main([str(out), "--window", "3"])
    assert e.value.code == 2 and "1 seed(s)" in capsys.readouterr().err
    assert spec.seeds == (0, 1, 2)


def test_nan_steps_left_out_of_the_means_are_noted(tmp_path, capsys):
    """Was: a NaN step vanished from an arm's mean without a word."""
    spec = _sweep(tmp_path / "s")
    folder = run_dir(tmp_path / "s", "fp8", 1)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    rows[3]["rollout/entropy"] = None  # how a non-finite value is logged
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    agg = aggregate_runs(tmp_path / "s" / SPEC_FILE, tmp_path / "s")
    assert agg["arms"]["fp8"]["nonfinite_steps"] == {"rollout/entropy": 1}
    assert "nonfinite_steps" not in agg["arms"]["bf16"]
    assert arm_table.main([str(tmp_path / "s")]) == 0
    assert "`fp8`: 1 step(s) of rollout/entropy logged no finite value" in capsys.readouterr().out
    assert spec.seeds == (0, 1, 2)


def test_a_section_the_spec_sets_in_part_is_compared_field_by_field(tmp_path):
    """Was: a spec setting three fields of model.keep_high_precision refused its own runs,
    whose config.json holds the whole section with its defaults; a field that differs is
    still named, and a free-form mapping (task.options) is still compared whole."""
    keep = {"first_blocks": 2, "down_proj": True}
    full = {"lm_head": True, "first_blocks": 2, "last_blocks": 0, "down_proj": True, "modules": []}
    spec = load_spec(
        {
            "base": {
                "train": {"steps": STEPS},
                "model": {"keep_high_precision": keep},
                "task": {"options": {"digits": 1}},
            },
            "arms": {"fp8": {}},
            "seeds": [0, 1],
        }
    )
    out = tmp_path / "s"
    out.mkdir()

    def as_written(data):
        data["model"]["keep_high_precision"] = dict(full)

    _write_runs(out, spec, STEPS, as_written)
    complete_runs(out, spec, ())
    folder = run_dir(out, "fp8", 1)
    data = json.loads((folder / "config.json").read_text())
    data["model"]["keep_high_precision"]["down_proj"] = False
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(IncompleteRunsError, match="model.keep_high_precision.down_proj"):
        complete_runs(out, spec, ())
    data["model"]["keep_high_precision"]["down_proj"] = True
    data["task"]["options"] = {"digits": 1, "ops": "*"}
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(IncompleteRunsError, match="task.options"):
        complete_runs(out, spec, ())
