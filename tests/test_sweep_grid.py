"""Grid sweeps (study/sweep/grid.py): axes of named values expanded into arms, cells that pair
each arm with its reference, the spec written back, errors naming the part of the spec."""

from __future__ import annotations

import json

import pytest

from fp8rl.errors import ConfigError
from fp8rl.study.sweep.spec import load_spec, run_configs
from helpers_config import tiny_config

RECIPES = {
    "tensorwise": {
        "rollout": {"precision": "fp8-tensorwise"},
        "train": {"precision": "fp8-tensorwise"},
    },
    "rowwise": {"rollout": {"precision": "fp8-rowwise"}, "train": {"precision": "fp8-rowwise"}},
}


def _grid_spec(tmp_path, **top) -> dict:
    spec = {
        "base": tiny_config(tmp_path / "unused", train={"steps": 3, "lr": 1e-3}),
        "arms": {
            "bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
            # the arm's own lr loses to the grid's: a value is more specific than its arm
            "fp8": {"calibration": {"diagnostics": True}, "train": {"lr": 0.5}},
        },
        "seeds": [100, 101],
        "grid": {
            "lr": {
                "values": {"lr1e-4": {"train": {"lr": 1e-4}}, "lr1e-3": {"train": {"lr": 1e-3}}}
            },
            "recipe": {"arms": ["fp8"], "values": RECIPES},
        },
    }
    spec.update(top)
    return spec


def test_grid_expands_arms_and_pairs_each_cell_with_its_reference(tmp_path):
    spec = load_spec(_grid_spec(tmp_path))
    # bf16 varies with lr only: 2 arms serve the 4 cells; fp8 runs in every cell
    assert list(spec.arms) == [
        "bf16--lr1e-4",
        "bf16--lr1e-3",
        "fp8--lr1e-4--tensorwise",
        "fp8--lr1e-4--rowwise",
        "fp8--lr1e-3--tensorwise",
        "fp8--lr1e-3--rowwise",
    ]
    assert len(spec.runs()) == 6 * 2
    cells = spec.cells()
    assert [c.name for c in cells] == [
        "lr1e-4--tensorwise",
        "lr1e-4--rowwise",
        "lr1e-3--tensorwise",
        "lr1e-3--rowwise",
    ]
    assert cells[1].values == {"lr": "lr1e-4", "recipe": "rowwise"}
    assert cells[1].arms == {"bf16": "bf16--lr1e-4", "fp8": "fp8--lr1e-4--rowwise"}
    configs = run_configs(spec, tmp_path / "out")
    fp8 = configs["fp8--lr1e-3--tensorwise", 101]
    assert (fp8.train.lr, fp8.train.precision, fp8.rollout.precision) == (
        1e-3,
        "fp8-tensorwise",
        "fp8-tensorwise",
    )
    assert fp8.calibration.diagnostics and fp8.train.seed == 101
    assert fp8.log.out_dir == str(tmp_path / "out" / "fp8--lr1e-3--tensorwise" / "seed-101")
    bf16 = configs["bf16--lr1e-4", 100]
    assert (bf16.train.lr, bf16.train.precision, bf16.name) == (1e-4, "bf16", "bf16--lr1e-4")
    assert not (tmp_path / "out").exists()


def test_grid_spec_round_trips_through_to_dict(tmp_path):
    spec = load_spec(_grid_spec(tmp_path))
    again = load_spec(json.loads(json.dumps(spec.to_dict())))  # as spec.json holds it
    assert again.arms == spec.arms and again.cells() == spec.cells()
    assert again.to_dict() == spec.to_dict() and set(spec.to_dict()["arms"]) == {"bf16", "fp8"}


def test_no_grid_is_one_cell_of_the_arms_themselves(tmp_path):
    spec = load_spec(_grid_spec(tmp_path, grid=None))
    assert list(spec.arms) == ["bf16", "fp8"] and "grid" not in spec.to_dict()
    (cell,) = spec.cells()
    assert cell.name == "" and cell.arms == {"bf16": "bf16", "fp8": "fp8"}


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda g: g.update(lr=[1, 2]), "grid.lr"),
        (lambda g: g.update({"a--b": {"values": {"x": {}}}}), "grid.a--b"),
        (lambda g: g["lr"].update(values={}), "grid.lr.values"),
        (lambda g: g["lr"]["values"].update({"bad--name": {}}), "grid.lr.values.bad--name"),
        (lambda g: g["lr"]["values"].update(x=3), "grid.lr.values.x"),
        (lambda g: g["recipe"].update(arms=["fp9"]), "grid.recipe.arms"),
        (lambda g: g["recipe"].update(step=1), "grid.recipe"),
    ],
)
def test_bad_grid_names_the_key(tmp_path, change, needle):
    spec = _grid_spec(tmp_path)
    change(spec["grid"])
    with pytest.raises(ConfigError) as e:
        load_spec(spec)
    assert e.value.key == needle


def test_bad_value_is_named_where_the_spec_sets_it(tmp_path):
    spec = _grid_spec(tmp_path)
    spec["grid"]["lr"]["values"]["lr1e-3"]["train"]["lr"] = -1.0
    with pytest.raises(ConfigError) as e:
        run_configs(load_spec(spec), tmp_path / "out")
    assert e.value.key == "grid.lr.values.lr1e-3.train.lr"
    spec = _grid_spec(tmp_path)
    spec["arms"]["fp8"]["calibration"]["interval"] = 0
    with pytest.raises(ConfigError) as e:
        run_configs(load_spec(spec), tmp_path / "out")
    assert e.value.key == "arms.fp8.calibration.interval"
    spec = _grid_spec(tmp_path)
    spec["base"]["rollout"]["n"] = 0
    with pytest.raises(ConfigError) as e:
        run_configs(load_spec(spec), tmp_path / "out")
    assert e.value.key == "base.rollout.n"


def test_arm_names_with_the_separator_are_refused_in_a_grid(tmp_path):
    spec = _grid_spec(tmp_path)
    spec["arms"]["fp8--x"] = {}
    with pytest.raises(ConfigError) as e:
        load_spec(spec)
    assert e.value.key == "arms.fp8--x"
    del spec["grid"]
    assert "fp8--x" in load_spec(spec).arms  # without a grid the name is as good as any


def test_sets_change_a_copy_of_the_spec_before_it_loads(tmp_path):
    spec = _grid_spec(tmp_path)
    sets = ["seeds=[7]", "base.train.steps=1", "grid.lr.values={lr1e-4: {train: {lr: 1.0e-4}}}"]
    small = load_spec(spec, sets)
    assert small.seeds == (7,) and small.base["train"]["steps"] == 1
    assert list(small.arms) == ["bf16--lr1e-4", "fp8--lr1e-4--tensorwise", "fp8--lr1e-4--rowwise"]
    assert spec["seeds"] == [100, 101] and spec["base"]["train"]["steps"] == 3  # not changed
    assert load_spec(load_spec(spec), ["seeds=[1]"]).seeds == (1,)
    for bad, key in (("seeds", "--set"), ("=3", "--set"), ("seeds=[1", "--set seeds")):
        with pytest.raises(ConfigError) as e:
            load_spec(spec, [bad])
        assert e.value.key == key
