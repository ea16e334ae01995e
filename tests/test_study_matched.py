"""The matched study's choosing rules (study/matched.py, docs/study-matched.md): the BF16 gate
and the probes' signatures, on constructed sweeps and hand-computed statistics."""

from __future__ import annotations

import json
import math

import pytest

from fp8rl.study import matched
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir

SEEDS = [100, 101, 102, 103, 104]
STEPS = 60
LRS = {"lr1e-5": 1e-5, "lr3e-5": 3e-5, "lr1e-4": 1e-4}


def _write(out, spec_dict: dict, rows_of) -> None:
    spec = load_spec(spec_dict)
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        rows = rows_of(arm, seed)
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        done = {"eval_final": {"eval/mean@1": 0.2}, "wall_s": 1.0, "resumed_at": None}
        (folder / "done.json").write_text(json.dumps(done))


def _gate_rows(reward_end: float, garble_from: int | None = None):
    def rows():
        return [
            {
                "step": s,
                "rollout/reward": 0.2 if s < 10 else reward_end,
                "rollout/entropy": 0.25,
                "rollout/malformed_frac": 0.5
                if garble_from is not None and s >= garble_from
                else 0.0,
                "rollout/response_len": 40.0,
            }
            for s in range(STEPS)
        ]

    return rows()


def _gate_spec():
    values = {name: {"train": {"lr": lr}} for name, lr in LRS.items()}
    return {
        "base": {"train": {"steps": STEPS}},
        "arms": {"bf16": {}},
        "grid": {"lr": {"values": values}},
        "seeds": SEEDS,
        "final_window": 20,
    }


def _gate_sweep(tmp_path, behaviour):
    """behaviour(lr, seed) -> (reward_end, garble_from)."""
    out = tmp_path / "gate"

    def rows_of(arm, seed):
        lr = LRS[arm.split("--")[1]]
        return _gate_rows(*behaviour(lr, seed))

    _write(out, _gate_spec(), rows_of)
    return out


def test_gate_chooses_the_largest_stable_rate_that_learns(tmp_path, capsys):
    # 1e-4: seed 102 garbles (the garble criterion fires); 3e-5 learns; 1e-5 learns less
    def behaviour(lr, seed):
        if lr == 1e-4:
            return 0.35, (30 if seed == 102 else None)
        return (0.3 if lr == 3e-5 else 0.22), None

    out = _gate_sweep(tmp_path, behaviour)
    assert matched.main(["gate", str(out)]) == 0
    text = capsys.readouterr().out
    result = json.loads((out / "gate.json").read_text())
    assert result["chosen"] == {"cell": "lr3e-5", "lr": 3e-5}
    by_lr = {c["lr"]: c for c in result["cells"]}
    assert by_lr[1e-4]["degraded"] == {"102": ["garble"]} and not by_lr[1e-4]["stable"]
    # reward gain: the last 20 steps' mean minus the first 10's (0.2)
    assert by_lr[3e-5]["reward_gain"]["mean"] == pytest.approx(0.1)
    assert by_lr[1e-5]["learns"] and by_lr[1e-5]["stable"]
    assert "learning rate 3e-05 (lr3e-5)" in text and "1/5 (seed 102: garble)" in text


def test_gate_says_fallback_when_no_rate_learns(tmp_path, capsys):
    out = _gate_sweep(tmp_path, lambda lr, seed: (0.2, None))  # reward never rises
    assert matched.main(["gate", str(out)]) == 0
    assert json.loads((out / "gate.json").read_text())["chosen"] is None
    assert "fallback" in capsys.readouterr().out


def test_a_gate_whose_cells_share_a_rate_chooses_nothing(tmp_path, capsys):
    """Was: a 'chosen' rate among cells that differ in something else."""
    spec = _gate_spec()
    spec["grid"]["lr"]["values"] = {name: {"train": {"lr": 3e-5}} for name in LRS}
    out = tmp_path / "gate"
    _write(out, spec, lambda arm, seed: _gate_rows(0.3, None))
    with pytest.raises(SystemExit) as e:
        matched.main(["gate", str(out)])
    assert e.value.code == 2 and "share learning rates" in capsys.readouterr().err
    assert not (out / "gate.json").exists()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: (f / "done.json").unlink(), "not finished"),
        (lambda f: f.joinpath("metrics.jsonl").write_text(""), "no metrics row for step 0"),
        (lambda f: _cut(f, 45), "no metrics row for step 45"),
        (
            lambda f: _poison(f, 7, "rollout/reward", float("nan")),
            "step 7 has no finite rollout/reward",
        ),
        (lambda f: _poison(f, 3, "rollout/entropy", None), "step 3 has no finite rollout/entropy"),
    ],
)
def test_gate_refuses_missing_short_or_nan_runs_and_writes_nothing(tmp_path, capsys, damage, says):
    out = _gate_sweep(tmp_path, lambda lr, seed: (0.3, None))
    damage(run_dir(out, "bf16--lr3e-5", 103))
    with pytest.raises(SystemExit) as e:
        matched.main(["gate", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "seed-103" in err and "Traceback" not in err
    assert not (out / "gate.json").exists() and not (out / "gate.md").exists()


def test_gate_refuses_a_folder_without_a_sweep(tmp_path, capsys):
    with pytest.raises(SystemExit):
        matched.main(["gate", str(tmp_path)])
    assert "spec.json not found" in capsys.readouterr().err


def _rows_of(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _cut(folder, keep: int):
    rows = _rows_of(folder)[:keep]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _poison(folder, step: int, key: str, value):
    rows = _rows_of(folder)
    rows[step][key] = value
    # NaN as JSON's NaN token, as Python writes it; the reader must not take it as a number
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


# ---- probes ----------------------------------------------------------------------------


def _probe_row(step, nmae, quotient, fp8, bf16, low_fp8, low_bf16, high=None):
    row = {
        "step": step,
        "shadow/nmae_prob": nmae,
        "shadow/nmae_quotient": quotient,
        "shadow/clipfrac_fp8": fp8,
        "shadow/clipfrac_bf16": bf16,
        "shadow/clipfrac_lower_neg_fp8": low_fp8,
        "shadow/clipfrac_lower_neg_bf16": low_bf16,
    }
    if high is not None:
        row["shadow/high_entropy_lower_clip_share"] = high
    return row


def test_run_signatures_by_hand():
    rows = [
        _probe_row(0, 9.0, 9.0, 9.0, 0.0, 9.0, 0.0, 1.0),  # step 0: left out of everything
        _probe_row(1, 0.02, 2.0, 0.04, 0.01, 0.03, 0.005, 0.5),
        _probe_row(2, 0.03, 2.4, 0.02, 0.01, 0.01, 0.005),  # no lower clip: no S5 value
        _probe_row(3, 0.01, 1.6, 0.06, 0.01, 0.05, 0.0, 0.1),
    ]
    s = matched.run_signatures(rows, skip_steps=1)
    assert s["S1"] == pytest.approx(0.02)
    assert s["S2"] == pytest.approx(2.0)
    assert s["S3"] == pytest.approx(0.12 / 0.03)
    # extra clips 0.12 - 0.03 = 0.09, of which at the lower bound (0.09 - 0.01) = 0.08
    assert s["S4"] == pytest.approx(0.08 / 0.09)
    assert s["S5"] == pytest.approx(0.3)
    none = matched.run_signatures([_probe_row(1, 0.01, 2.0, 0.0, 0.0, 0.0, 0.0)], 1)
    assert none["S3"] is None and none["S4"] is None and none["S5"] is None
    # a null quotient (0/0) leaves S2 undefined, not a crash and not a number
    assert matched.run_signatures([_probe_row(1, 0.01, None, 0.0, 0.0, 0.0, 0.0)], 1)["S2"] is None
    only_fp8 = matched.run_signatures([_probe_row(1, 0.01, 2.0, 0.01, 0.0, 0.01, 0.0)], 1)
    assert only_fp8["S3"] == math.inf and only_fp8["S4"] == pytest.approx(1.0)


def _table(**recipes):
    """recipe=(nmae, [met S1..S5])"""
    keys = [k for k, *_ in matched.SIGNATURES]
    return {
        r: {"stats": {"S1": {"mean": nmae}}, "met": dict(zip(keys, met, strict=True))}
        for r, (nmae, met) in recipes.items()
    }


def test_choose_recipe_by_hand():
    yes, no = True, False
    # fp8 meets more signatures but not S1: only S1's candidates count
    t = _table(fp8=(0.005, [no, yes, yes, yes, yes]), nvfp4=(0.025, [yes, yes, no, no, no]))
    assert matched.choose_recipe(t)["recipe"] == "nvfp4"
    # equal counts: the NMAE nearer 2 % (log distance: 1.5 % is nearer than 3 %)
    t = _table(mxfp4=(0.03, [yes, yes, no, no, no]), nvfp4=(0.015, [yes, no, yes, no, no]))
    assert matched.choose_recipe(t)["recipe"] == "nvfp4"
    # no candidate meets S1: all are candidates, most signatures first
    t = _table(a=(0.005, [no, yes, no, no, no]), b=(0.004, [no, yes, yes, no, no]))
    assert matched.choose_recipe(t)["recipe"] == "b"
    # a full tie: the spec's order
    t = _table(a=(0.02, [yes, no, no, no, no]), b=(0.02, [yes, no, no, no, no]))
    assert matched.choose_recipe(t)["recipe"] == "a"
    # nothing to choose: no recipe meets a signature, or no recipe at all (was: the first one;
    # a ValueError traceback)
    t = _table(a=(0.02, [no, no, no, no, no]), b=(0.01, [no, no, no, no, no]))
    assert matched.choose_recipe(t)["recipe"] is None
    assert matched.choose_recipe({})["recipe"] is None


def test_probes_end_to_end_on_a_constructed_sweep(tmp_path, capsys):
    recipes = {"fp8-blockwise": 0.006, "nvfp4": 0.022}
    spec = {
        "base": {"train": {"steps": 6}},
        "arms": {r: {"train": {"precision": r}} for r in recipes},
        "seeds": [100, 101, 102],
    }

    def rows_of(arm, seed):
        n = recipes[arm]
        small = arm == "fp8-blockwise"  # clips like BF16: S3 and S4 unmet
        return [
            _probe_row(
                s,
                n * (1 + 0.01 * (seed % 3)),
                1.5 if small else 2.2,
                0.011 if small else 0.04,
                0.01,
                0.0015 if small else 0.035,  # S4: 0.0005 of 0.001 extra
                0.001 if small else 0.005,
                0.05 if small else 0.4,
            )
            for s in range(6)
        ]

    out = tmp_path / "probes"
    _write(out, spec, rows_of)
    assert matched.main(["probes", str(out)]) == 0
    result = json.loads((out / "signatures.json").read_text())
    assert result["chosen"]["recipe"] == "nvfp4"
    assert result["table"]["nvfp4"]["met"] == dict.fromkeys(["S1", "S2", "S3", "S4", "S5"], True)
    assert sum(result["table"]["fp8-blockwise"]["met"].values()) == 0
    assert "Noise-matched recipe by the protocol's rule: nvfp4" in capsys.readouterr().out


def test_confirmatory_signatures_and_the_high_entropy_channel(tmp_path, capsys):
    """Every arm has shadow passes every 20 steps; bf16's are of itself (its NMAE quotient is
    null, 0/0, as in real runs) and it gets no signature row; matched has a high-entropy share
    of 0.2 before step 100 and 0.6 + 0.02 (seed - 100) after: reproduced (late mean 0.64,
    interval above 0.1); fp8's late share 0.1 is not judged."""
    spec = {
        "base": {"train": {"steps": 200}},
        "arms": {
            "bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
            "fp8": {},
            "matched": {"train": {"precision": "nvfp4"}},
        },
        "seeds": SEEDS,
        "final_window": 50,
    }

    def rows_of(arm, seed):
        rows = []
        for s in range(200):
            row = {
                "step": s,
                "rollout/reward": 0.3,
                "rollout/entropy": 0.25,
                "rollout/malformed_frac": 0.0,
            }
            if arm == "bf16" and s % 20 == 0:
                row.update(_probe_row(s, 0.0, None, 0.01, 0.01, 0.005, 0.005, 0.1))
            elif s % 20 == 0:
                late = 0.6 + 0.02 * (seed - 100) if arm == "matched" else 0.1
                row.update(_probe_row(s, 0.02, 2.0, 0.04, 0.01, 0.035, 0.005))
                row["shadow/high_entropy_lower_clip_share"] = late if s >= 100 else 0.2
            rows.append(row)
        return rows

    out = tmp_path / "confirm"
    _write(out, spec, rows_of)
    assert matched.main(["confirmatory", str(out)]) == 0
    result = json.loads((out / "signatures_channel.json").read_text())
    assert set(result["signatures"]) == {"fp8", "matched"}  # bf16's shadow is itself
    # step 0 is left out: 9 shadow steps of 20..180
    assert result["signatures"]["matched"]["stats"]["S3"]["mean"] == pytest.approx(4.0)
    ch = result["channel"]
    assert ch["arms"]["matched"]["early"]["mean"] == pytest.approx(0.2)
    assert ch["arms"]["matched"]["late"]["mean"] == pytest.approx(0.64)
    assert ch["arms"]["bf16"]["late"]["mean"] == pytest.approx(0.1)  # chance, as a reference
    assert ch["reproduced"] is True
    assert "**reproduced**" in capsys.readouterr().out


def test_the_channel_is_not_reproduced_near_chance(tmp_path):
    from fp8rl.study.sweep.spec import load_spec as load

    spec = load({"base": {}, "arms": {"matched": {}}, "seeds": SEEDS})
    runs = {
        "matched": {
            s: [{"step": t, matched.HIGH: 0.12 + 0.01 * (s - 100)} for t in range(0, 200, 20)]
            for s in SEEDS
        }
    }
    ch = matched.channel(spec, runs)
    assert ch["arms"]["matched"]["late"]["mean"] == pytest.approx(0.14)
    assert ch["reproduced"] is False


def _refit(step, lower_target, next_lower, upper_target, next_upper):
    return {
        "step": step,
        "calib/updated": 1.0,
        "calib/lower_target": lower_target,
        "calib/next_lower": next_lower,
        "calib/upper_target": upper_target,
        "calib/next_upper": next_upper,
    }


def test_cap_table_counts_the_refits_a_cap_held_off_target():
    # seed 0: the lower cap holds at refits 20 and 40 (0.75, 0.70 against L* 0.3), free at 60;
    # the upper reaches its target each time. seed 1: never capped. Non-refit rows: updated 0.
    seed0 = [
        {"step": 0, "calib/updated": 0.0},
        _refit(20, 0.3, 0.75, 1.3, 1.3),
        _refit(40, 0.3, 0.70, 1.4, 1.4),
        _refit(60, 0.65, 0.65, 1.4, 1.4),
    ]
    seed1 = [_refit(20, 0.7, 0.7, 1.2, 1.2), _refit(40, 0.6, 0.6, 1.8, 1.3)]
    table = matched.cap_table({"cc": {0: seed0, 1: seed1}, "bf16": {0: [{"step": 0}], 1: []}})
    assert set(table) == {"cc"}
    assert table["cc"]["refits"]["per_seed"] == [3, 2]
    assert table["cc"]["lower_capped"]["per_seed"] == [2, 0]
    assert table["cc"]["upper_capped"]["per_seed"] == [0, 1]
    assert table["cc"]["lower_target_last"]["mean"] == pytest.approx(0.625)
    with pytest.raises(matched.IncompleteRunsError, match="cc: some seeds refit"):
        matched.cap_table({"cc": {0: seed0, 1: [{"step": 0}]}})


def test_cap_table_refuses_a_refit_without_its_targets():
    bad = [_refit(20, 0.3, 0.75, 1.3, 1.3), _refit(40, 0.3, 0.7, 1.4, 1.4)]
    bad[1]["calib/lower_target"] = float("nan")
    with pytest.raises(
        matched.IncompleteRunsError, match="cc seed 0, step 40: .* calib/lower_target"
    ):
        matched.cap_table({"cc": {0: bad}})
