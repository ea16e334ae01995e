"""The cells of a grid sweep against their reference (study/sweep/cells.py, phase.py):
outcomes and seed-paired differences against hand computations on constructed run folders,
the degradation rule per seed, the confirmatory-cell rule, the table and the phase plots."""

from __future__ import annotations

import json
import math

import pytest

from fp8rl.errors import Fp8rlError
from fp8rl.study.sweep.cells import choose_cell, run_outcomes, trajectory
from fp8rl.study.sweep.phase import cells_table, main, write_cells
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.study.sweep.stats import t_quantile

STEPS, W = 60, 20


def _rows(reward, entropy, garble=0.0, length=40.0, excess=None):
    """Constant-per-phase series: reward(step), entropy(step) are callables."""
    rows = []
    for s in range(STEPS):
        r = {
            "step": s,
            "rollout/reward": reward(s),
            "rollout/entropy": entropy(s),
            "rollout/malformed_frac": garble,
            "rollout/response_len": length,
        }
        if excess is not None and s % 20 == 0:
            r["shadow/lower_clip_excess"] = excess
        rows.append(r)
    return rows


def test_run_outcomes_by_hand():
    rows = _rows(lambda s: s / 100, lambda s: 0.5 if s < 30 else 0.2, 0.1, 33.0, excess=0.004)
    rows[5]["rollout/reward"] = None  # a step without a finite reward is left out
    out = run_outcomes(rows, {"eval_final": {"eval/mean@1": 0.25}}, window=W, skip_steps=1)
    first = [s / 100 for s in range(10) if s != 5]
    assert out["reward_last"] == pytest.approx(sum(range(40, 60)) / 100 / 20)
    assert out["reward_gain"] == pytest.approx(out["reward_last"] - sum(first) / len(first))
    assert out["entropy_last"] == pytest.approx(0.2)
    assert out["entropy_drift"] == pytest.approx(0.2 - 0.5)
    assert (out["garble_last"], out["length_last"], out["accuracy_end"]) == (0.1, 33.0, 0.25)
    assert out["lower_clip_excess"] == pytest.approx(0.004)  # steps 20 and 40; 0 is skipped
    assert out["steps"] == STEPS
    assert math.isnan(trajectory(rows)["reward"][5]) and len(trajectory(rows)["entropy"]) == STEPS


def sweep_spec():
    return {
        "base": {},
        "arms": {"bf16": {}, "fp8": {}},
        "seeds": [100, 101, 102],
        "final_window": W,
        "grid": {
            "lr": {"values": {"lo": {"train": {"lr": 1e-5}}, "hi": {"train": {"lr": 1e-4}}}},
            "recipe": {"arms": ["fp8"], "values": {"tw": {}, "rw": {}}},
        },
    }


# per (expanded arm, seed): the reward level of the last steps and whether entropy surges
FLAT = 0.3


def _write_sweep(out, gaps, surge=()):
    """A finished grid sweep on disk: bf16 learns (0.2 -> 0.2 + 0.1 * seed index) at both
    lrs; fp8 in cell c trails it by gaps[c][i] on seed i; the (arm, seed) in `surge` triple
    their entropy from step 20 on (the band criterion fires at step 29)."""
    spec = load_spec(sweep_spec())
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm in spec.arms:
        for i, seed in enumerate(spec.seeds):
            level = 0.2 + 0.1 * i
            cell = arm.split("--", 1)[1] if arm.startswith("fp8") else None
            if cell is not None:
                level -= gaps[cell][i]
            hot = (arm, seed) in surge
            rows = _rows(
                lambda s, lv=level: 0.2 if s < 10 else lv,
                lambda s, h=hot: FLAT * (3 if h and s >= 20 else 1),
                garble=0.05 if cell else 0.0,
                excess=0.01 if cell else None,  # only FP8 runs run a shadow
            )
            folder = run_dir(out, arm, seed)
            folder.mkdir(parents=True)
            (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
            (folder / "config.json").write_text(json.dumps({"train": {"steps": STEPS}}))
            done = {"eval_final": {"eval/mean@1": level}, "wall_s": 1.0}
            (folder / "done.json").write_text(json.dumps(done))
    return spec


GAPS = {
    "lo--tw": [0.0, 0.0, 0.0],
    "lo--rw": [0.02, 0.04, 0.06],
    "hi--tw": [0.05, 0.06, 0.08],  # bf16's reward at seed 100 is 0.2: fp8 drops 0.05
    "hi--rw": [0.0, 0.01, 0.02],
}


def test_cells_pair_each_seed_with_the_reference_of_its_cell(tmp_path):
    out = tmp_path / "sweep"
    _write_sweep(out, GAPS, surge={("fp8--lo--rw", 101)})
    results = write_cells(load_spec(out / SPEC_FILE), out)
    cells = {c["name"]: c for c in results["cells"]}
    assert list(cells) == ["lo--tw", "lo--rw", "hi--tw", "hi--rw"]
    c = cells["lo--rw"]
    assert c["arms"] == {"bf16": "bf16--lo", "fp8": "fp8--lo--rw"}
    gap = c["compare"]["fp8"]["paired"]["reward_last"]
    # paired fp8 - bf16 per seed: -0.02, -0.04, -0.06: mean -0.04, sd 0.02, se 0.02/sqrt(3)
    assert gap["per_seed"] == pytest.approx([-0.02, -0.04, -0.06])
    assert gap["mean"] == pytest.approx(-0.04) and gap["se"] == pytest.approx(0.02 / math.sqrt(3))
    half = t_quantile(0.975, 2) * 0.02 / math.sqrt(3)
    assert gap["ci95"] == pytest.approx([-0.04 - half, -0.04 + half])
    assert c["compare"]["fp8"]["paired"]["garble_last"]["mean"] == pytest.approx(0.05)
    # the surging seed: entropy 0.9 > 2 x the bf16 band's top (0.3) for 10 steps from 20;
    # the detector (1.5 x the trailing median 0.3) flags steps 20, 21, 22
    judged = c["compare"]["fp8"]["degradation"]
    assert judged["101"]["fired"] == {"entropy_surge": 29, "surge_detector": 22}
    assert not judged["100"]["degraded"] and c["compare"]["fp8"]["degraded_seeds"] == 1
    drift = c["compare"]["fp8"]["paired"]["entropy_drift"]["per_seed"]
    assert drift[0] == pytest.approx(0.0) and drift[1] == pytest.approx(FLAT * 3 - FLAT)
    ref = c["ref"]
    assert ref["stable"] and ref["learns"]
    assert ref["outcomes"]["reward_last"]["mean"] == pytest.approx(0.3)
    # the surge outranks any reward gap: 1 degraded seed in lo--rw, none elsewhere
    assert results["chosen"]["cell"] == "lo--rw" and results["chosen"]["tier"] == 1
    table = (out / "cells.md").read_text()
    assert "| lo--rw |" in table and "1/3 (entropy_surge, surge_detector)" in table
    assert sorted(p.name for p in out.glob("phase_*.png")) == [
        "phase_entropy_drift.png",
        "phase_garble_last.png",
        "phase_reward_last.png",
    ]
    assert json.loads((out / "cells.json").read_text())["chosen"]["cell"] == "lo--rw"


def test_without_degradation_the_largest_reward_gap_is_chosen(tmp_path):
    out = tmp_path / "sweep"
    _write_sweep(out, GAPS)
    results = write_cells(load_spec(out / SPEC_FILE), out)
    assert results["chosen"]["cell"] == "hi--tw" and "-0.0633" in results["chosen"]["why"]


def _result(name, stable, learns, degraded, gap):
    paired = {"reward_last": {"mean": gap}}
    return {
        "name": name,
        "values": {"x": name},
        "ref": {"stable": stable, "learns": learns},
        "compare": {"fp8": {"degraded_seeds": degraded, "paired": paired}},
    }


def test_choose_cell_tiers_and_ties():
    cells = [
        _result("unstable", False, True, 5, -0.5),  # most degraded, but its bf16 is not stable
        _result("flat", True, False, 2, -0.3),  # stable bf16 that does not learn
        _result("a", True, True, 0, -0.01),
        _result("b", True, True, 0, -0.02),
        _result("c", True, True, 0, -0.02),  # ties b: the grid's order keeps b
    ]
    pick = choose_cell({"ref": "bf16", "cells": cells})
    assert (pick["cell"], pick["tier"]) == ("b", 1)
    pick = choose_cell({"ref": "bf16", "cells": cells[:2]})
    assert (pick["cell"], pick["tier"]) == ("flat", 2)
    assert choose_cell({"ref": "bf16", "cells": cells[:1]})["tier"] == 3
    with pytest.raises(Fp8rlError, match="no cell"):
        choose_cell({"ref": "bf16", "cells": cells}, arm="nvfp4")


def test_table_reads_the_results_and_the_cli_writes_them(tmp_path, capsys):
    out = tmp_path / "sweep"
    _write_sweep(out, GAPS)
    assert main([str(out)]) == 0
    printed = capsys.readouterr().out
    assert "chosen cell: hi--tw" in printed and (out / "cells.md").is_file()
    results = json.loads((out / "cells.json").read_text())
    lines = cells_table(results).splitlines()
    assert len(lines) == 2 + 4 and lines[0].startswith("| cell | bf16 reward, last 20 |")
    # the excess is FP8's own (over its shadow), not FP8 - bf16: bf16 runs have no shadow
    col = lines[0].split(" | ").index("fp8 lower-clip excess (pp)")
    assert all(row.split(" | ")[col].startswith("+1.00") for row in lines[2:])
    with pytest.raises(SystemExit):
        main([str(out), "--ref", "fp16"])
    assert "no reference arm 'fp16'" in capsys.readouterr().err


def test_fp8rl_sweep_of_a_grid_writes_the_cells(tmp_path, weights, capsys):
    """End to end: 2 lrs x 1 recipe, bf16 shared by the recipe axis, 2 seeds, 2 steps."""
    import yaml

    from fp8rl.cli import main as cli
    from helpers_config import sweep_spec

    spec = sweep_spec(tmp_path, weights)
    spec["grid"] = {
        "lr": {"values": {"lo": {"train": {"lr": 1e-4}}, "hi": {"train": {"lr": 1e-3}}}},
        "recipe": {"arms": ["fp8"], "values": {"rw": {"train": {"precision": "fp8-rowwise"}}}},
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    args = ["sweep", str(path), "--out", str(out), "--jobs", "2", "--no-progress"]
    assert cli(args + ["--set", "base.train.steps=2"]) == 0
    # 2 steps: the table describes the runs, but no cell is chosen from them
    assert json.loads((out / "cells.json").read_text())["chosen"]["cell"] is None
    said = "No cell chosen, no verdict: "
    assert said in capsys.readouterr().out and said in (out / "cells.md").read_text()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "bf16--hi",
        "bf16--lo",
        "fp8--hi--rw",
        "fp8--lo--rw",
    ]
    results = json.loads((out / "cells.json").read_text())
    assert [c["name"] for c in results["cells"]] == ["lo--rw", "hi--rw"]
    assert json.loads((out / "spec.json").read_text())["base"]["train"]["steps"] == 2
    rows = (out / "bf16--lo" / "seed-0" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2  # the spec says 3 steps; --set made it 2
    gap = results["cells"][1]["compare"]["fp8"]["paired"]["reward_last"]
    assert gap["n"] == 2 and len(gap["per_seed"]) == 2
    assert json.loads((out / "fp8--hi--rw" / "seed-1" / "config.json").read_text())["train"][
        "lr"
    ] == pytest.approx(1e-3)
