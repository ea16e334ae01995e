"""Seed-paired gaps by window (study/window_gaps.py) on constructed sweeps whose gaps are
known by hand, and its refusals: an unfinished run, an unknown arm, a window too long."""

from __future__ import annotations

import json

import pytest

from fp8rl.study import window_gaps as wg
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir

SEEDS = [0, 1, 2]
STEPS = 40


def _sweep(out, level):
    """level(arm, seed, step) -> (entropy, reward) of that step."""
    spec = load_spec(
        {
            "base": {"train": {"steps": STEPS}},
            "arms": {"bf16": {}, "a": {}, "b": {}},
            "seeds": SEEDS,
        }
    )
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        rows = []
        for s in range(STEPS):
            entropy, reward = level(arm, seed, s)
            rows.append({"step": s, "rollout/entropy": entropy, "rollout/reward": reward})
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (folder / "done.json").write_text(json.dumps({"wall_s": 1.0, "resumed_at": None}))
    return out


def _drifting(arm, seed, step):
    """a drifts away from bf16 by 0.001 a step (+ 0.01 x seed); b sits 0.02 below in reward."""
    entropy = 0.2 + (0.001 * step + 0.01 * seed if arm == "a" else 0.0)
    reward = 0.3 - (0.02 if arm == "b" else 0.0)
    return entropy, reward


def test_gaps_by_window_and_between_arms_by_hand(tmp_path, capsys):
    out = _sweep(tmp_path / "s", _drifting)
    assert wg.main([str(out), "--window", "20", "--pair", "a:b"]) == 0
    r = json.loads((out / "window_gaps.json").read_text())
    assert r["windows"] == [[0, 20], [20, 40]]
    ent = r["by_window"]["rollout/entropy"]["a"]
    # steps 0-19: mean step 9.5 -> 0.0095 + 0.01 (mean seed 1); steps 20-39: 0.0295 + 0.01
    assert [g["mean"] for g in ent] == pytest.approx([0.0195, 0.0395])
    assert ent[0]["per_seed"] == pytest.approx([0.0095, 0.0195, 0.0295])
    assert [g["mean"] for g in r["by_window"]["rollout/reward"]["b"]] == pytest.approx([-0.02] * 2)
    pair = r["pairs"]["a - b"]
    assert pair["rollout/reward"]["mean"] == pytest.approx(0.02)
    assert pair["rollout/entropy"]["mean"] == pytest.approx(0.0395)
    text = capsys.readouterr().out
    assert "| a - b | +0.039 [+0.015, +0.064] | +0.020 [+0.020, +0.020] |" in text


def test_refuses_an_unfinished_run_and_writes_nothing(tmp_path, capsys):
    out = _sweep(tmp_path / "s", _drifting)
    (run_dir(out, "a", 1) / "done.json").unlink()
    with pytest.raises(SystemExit) as e:
        wg.main([str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not finished" in err and str(run_dir(out, "a", 1)) in err
    assert not (out / "window_gaps.json").exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--pair", "a:nope"], "no arm nope"),
        (["--ref", "gone"], "no arm gone"),
        (["--window", "41"], "--window 41: must be 1..40"),
        (["--pair", "a"], "expected ARM_A:ARM_B"),
    ],
)
def test_refuses_bad_arguments_in_one_line(tmp_path, capsys, args, says):
    out = _sweep(tmp_path / "s", _drifting)
    with pytest.raises(SystemExit) as e:
        wg.main([str(out), *args])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not (out / "window_gaps.json").exists()
