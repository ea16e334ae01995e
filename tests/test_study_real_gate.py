"""The real-model study's gate (study/real_gate.py, docs/study-real.md "Step 1") on
constructed sweeps and evaluations, checked by hand; and the t test's power behind its power
statement (study/sweep/stats.py) against simulation and a published table value."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from fp8rl.study.export_runs import main as export_main
from fp8rl.study.learning import main as learning_main
from fp8rl.study.real_gate import choose_rate, gate, main, report_text
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.study.sweep.stats import detectable_effect, t_quantile, t_test_power
from fp8rl.train.runlog import read_metrics
from fp8rl.utils import json_safe
from helpers_evals import write_eval

STEPS = 60
RATES = {"fp32-lr2e-6": 2e-6, "fp32-lr5e-6": 5e-6, "fp32-lr1e-5": 1e-5}


# ---------------------------------------------------------------- the t test's power


@pytest.mark.parametrize("n", [2, 3, 5, 40])
def test_power_at_no_effect_is_the_test_level(n):
    assert t_test_power(0.0, n) == pytest.approx(0.05, abs=1e-6)


@pytest.mark.parametrize(("n", "effect"), [(2, 3.0), (3, 2.0), (5, 1.5)])
def test_power_matches_a_simulated_t_test(n, effect):
    x = np.random.default_rng(n).standard_normal((200_000, n)) + effect
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
    simulated = float((np.abs(t) > t_quantile(0.975, n - 1)).mean())
    se = (simulated * (1 - simulated) / 200_000) ** 0.5
    assert abs(t_test_power(effect, n) - simulated) < 4 * se


def test_power_matches_the_table_value_and_the_normal_limit():
    assert t_test_power(1.0, 10) == pytest.approx(0.8031, abs=5e-4)  # d = 1, n = 10 (G*Power)
    normal = (1.959964 + 0.841621) / 400**0.5  # z_0.975 + z_0.8 over sqrt(n)
    assert detectable_effect(400) == pytest.approx(normal, rel=3e-3)


@pytest.mark.parametrize("n", [3, 5])
def test_the_detectable_effect_has_the_asked_power(n):
    effect = detectable_effect(n)
    assert t_test_power(effect, n) == pytest.approx(0.8, abs=1e-6)
    assert t_test_power(0.9 * effect, n) < 0.8 < t_test_power(1.1 * effect, n)


# ---------------------------------------------------------------- the choice, by hand


@pytest.mark.parametrize(
    ("passes", "lr", "status"),
    [
        ({(1e-5, 100): True, (1e-5, 101): True, (1e-5, 102): True}, 1e-5, "chosen"),
        # the largest fails on seed 100: the next one, confirmed
        (
            {(1e-5, 100): False, (5e-6, 100): True, (5e-6, 101): True, (5e-6, 102): True},
            5e-6,
            "chosen",
        ),
        ({(1e-5, 100): True, (5e-6, 100): True}, 1e-5, "pending"),  # not confirmed yet
        # a confirming seed fails: the next smaller rate that passed on 100, unconfirmed
        ({(1e-5, 100): True, (1e-5, 101): False, (5e-6, 100): True}, 5e-6, "pending"),
        ({(1e-5, 100): True, (1e-5, 101): True, (1e-5, 102): False}, None, "stop"),
        ({(1e-5, 100): False, (5e-6, 100): False, (2e-6, 100): False}, None, "stop"),
        ({}, None, "pending"),
    ],
)
def test_choose_rate_by_hand(passes, lr, status):
    got = choose_rate(passes)
    assert (got["lr"], got["status"]) == (lr, status)
    failed = [
        r
        for r in (1e-5, 5e-6)
        if passes.get((r, 100)) and False in (passes.get((r, 101)), passes.get((r, 102)))
    ]
    assert got["not_confirmed"] == failed
    assert ("a confirming seed failed" in got["text"]) is bool(failed)


# ---------------------------------------------------------------- constructed sweeps


def _rows(gain: float, garble_late: float = 0.0, drop: bool = False) -> list[dict]:
    """Reward 0.2 over steps 0-9, then 0.2 + gain; garble 0 then `garble_late`; `drop`:
    the reward falls back to 0.2 for the last 25 steps (the reward-drop criterion fires)."""
    rows = []
    for s in range(STEPS):
        late = s >= 10 and not (drop and s >= STEPS - 25)
        rows.append(
            {
                "step": s,
                "rollout/reward": 0.2 + gain if late else 0.2,
                "rollout/entropy": 2.0 - 0.01 * s,
                "rollout/malformed_frac": garble_late if s >= 10 else 0.0,
                "actor/clipfrac_lower_neg": 0.0 if s == 0 else 0.01 * (1 + s % 2),
                "time/cpu_step": 30.0 + s % 2,
                "rollout/response_len": 40.0 - 0.5 * s,
            }
        )
    return rows


def _write_sweep(out, runs: dict, seeds, precision="fp32"):
    """runs: {arm: {seed: rows}}; each arm's lr from RATES."""
    base = {"rollout": {"precision": precision}, "train": {"precision": "fp32", "steps": STEPS}}
    arms = {arm: {"train": {"lr": RATES[arm]}} for arm in runs}
    spec = load_spec({"base": base, "arms": arms, "seeds": list(seeds)})
    out.mkdir(parents=True)
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm, per_seed in runs.items():
        for seed, rows in per_seed.items():
            folder = run_dir(out, arm, seed)
            folder.mkdir(parents=True)
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            resolved = {
                "rollout": {"precision": precision},
                "train": {"precision": "fp32", "steps": STEPS, "lr": RATES[arm]},
            }
            (folder / "config.json").write_text(json.dumps(resolved))
            (folder / "done.json").write_text(json.dumps({"steps": STEPS}))


BEFORE = [2, 2, 3, 1, 2, 2, 3, 1]  # of 8 samples each
UP = [4, 5, 5, 3, 4, 4, 5, 3]  # +2.25 of 8 on average, every problem up: interval above 0


def _study(tmp_path, gate_rows: dict, confirm_rows: dict | None = None, confirm_arm="fp32-lr1e-5"):
    evals = tmp_path / "evals"
    write_eval(tmp_path / "before.json", BEFORE)
    _write_sweep(tmp_path / "gate", {arm: {100: rows} for arm, rows in gate_rows.items()}, [100])
    for arm in gate_rows:
        write_eval(evals / arm / "seed-100.json", UP)
    sweeps = [str(tmp_path / "gate")]
    if confirm_rows:
        _write_sweep(tmp_path / "confirm", {confirm_arm: confirm_rows}, list(confirm_rows))
        for seed in confirm_rows:
            write_eval(evals / confirm_arm / f"seed-{seed}.json", UP)
        sweeps.append(str(tmp_path / "confirm"))
    return [*sweeps, "--before", str(tmp_path / "before.json"), "--evals", str(evals)]


def test_the_largest_confirmed_rate_is_chosen_and_its_spread_gives_the_power(tmp_path, capsys):
    gate = {"fp32-lr2e-6": _rows(0.2), "fp32-lr5e-6": _rows(0.3), "fp32-lr1e-5": _rows(0.4)}
    argv = _study(tmp_path, gate, {101: _rows(0.5), 102: _rows(0.6)})
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert data["choice"]["lr"] == 1e-5 and data["choice"]["status"] == "chosen"
    assert all(r["passes"] for r in data["runs"]) and len(data["runs"]) == 5
    first = data["runs"][0]  # sorted by (lr, seed): lr 2e-6
    assert first["reward"]["gain"] == pytest.approx(0.2 * 20 / 20)  # last 20 all at 0.4
    assert first["accuracy"]["diff"] == pytest.approx((sum(UP) - sum(BEFORE)) / 8 / 8)
    assert first["clipfrac_lower_neg"] == pytest.approx(
        statistics.mean(0.01 * (1 + s % 2) for s in range(1, STEPS))
    )
    assert first["cpu_hours"] == pytest.approx(STEPS * 30.5 / 3600)
    # reward over the last 20 steps at lr 1e-5: 0.6, 0.7, 0.8 on seeds 100-102: sd 0.1
    p = data["power"]
    assert p["sd"]["reward"] == pytest.approx(0.1) and p["sd"]["entropy"] == pytest.approx(0.0)
    assert p["detectable"]["3"]["reward"] == pytest.approx(0.1 * detectable_effect(3))
    assert p["judged_seeds"] == 5  # 0.33 > 0.10: seeds 3 and 4 join
    assert "lr 1e-05: passes on seeds 100-102" in capsys.readouterr().out


def test_rising_garble_and_a_reward_drop_fail_the_gate(tmp_path):
    gate = {
        "fp32-lr2e-6": _rows(0.2),
        "fp32-lr5e-6": _rows(0.3, garble_late=0.06),  # up 0.06 > 0.05
        "fp32-lr1e-5": _rows(0.4, drop=True),  # falls 0.4 below its best for 25 steps
    }
    assert main([*_study(tmp_path, gate), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "gate.json").read_text())
    failed = {r["lr"]: r["failed"] for r in data["runs"]}
    assert failed[2e-6] == [] and failed[5e-6] == ["garble up +0.060"]
    assert any("reward_drop" in f for f in failed[1e-5])
    assert data["choice"]["lr"] == 2e-6 and data["choice"]["status"] == "pending"
    assert "power" not in data


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_a_missing_evaluation_or_an_unfinished_run_is_one_line(tmp_path, capsys):
    argv = _study(tmp_path, {"fp32-lr2e-6": _rows(0.2)})
    (tmp_path / "evals" / "fp32-lr2e-6" / "seed-100.json").unlink()
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "seed-100.json: no held-out evaluation" in _error(capsys)
    write_eval(tmp_path / "evals" / "fp32-lr2e-6" / "seed-100.json", UP)
    (run_dir(tmp_path / "gate", "fp32-lr2e-6", 100) / "done.json").unlink()
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "not finished" in _error(capsys)
    assert not (tmp_path / "out").exists()


def test_two_runs_of_one_rate_and_seed_or_an_fp8_run_are_refused(tmp_path, capsys):
    argv = _study(tmp_path, {"fp32-lr1e-5": _rows(0.2)}, {100: _rows(0.3)})
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "two runs of lr 1e-05, seed 100" in _error(capsys)
    _write_sweep(tmp_path / "fp8", {"fp32-lr2e-6": {100: _rows(0.2)}}, [100], precision="fp8")
    argv = [str(tmp_path / "fp8"), *argv[2:]]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "rollout.precision is 'fp8'" in _error(capsys)


def test_the_gate_reads_the_exported_runs_with_their_samples_and_resumes(tmp_path, capsys):
    argv = _study(tmp_path, {"fp32-lr2e-6": _rows(0.2)})
    folder = run_dir(tmp_path / "gate", "fp32-lr2e-6", 100)
    (folder / "samples.jsonl").write_text(json.dumps({"step": 3, "response": "7 + 5 = 12"}) + "\n")
    (folder / "events.log").write_text("step 25: resumed from step_00000025\n")
    assert export_main([str(tmp_path / "gate"), str(tmp_path / "raw")]) == 0
    copy = run_dir(tmp_path / "raw", "fp32-lr2e-6", 100)
    assert read_metrics(copy, name="samples.jsonl") == [{"step": 3, "response": "7 + 5 = 12"}]
    assert (copy / "events.log").read_text() == "step 25: resumed from step_00000025\n"
    assert (
        learning_main(
            [
                str(copy),
                "--before",
                argv[2],
                "--after",
                argv[4] + "/fp32-lr2e-6/seed-100.json",
                "--out",
                str(tmp_path / "l"),
            ]
        )
        == 0
    )
    assert "resumed at [25]" in capsys.readouterr().out
    assert main([str(tmp_path / "raw"), *argv[1:], "--out", str(tmp_path / "a")]) == 0
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "gate.json").read_text()) for d in "ab")
    assert a["runs"][0]["run"] != b["runs"][0]["run"]
    a["runs"][0]["run"] = b["runs"][0]["run"]
    assert a == b


REPO = Path(__file__).resolve().parents[1]


def test_the_committed_gate_recomputes_from_the_committed_runs(monkeypatch):
    """docs/study-real/gate/gate.{json,md} from the committed runs and evaluations (seed 100's
    sweep and each confirming one), the doc's table from it, and once a rate is chosen, the
    judged config written from it."""
    monkeypatch.chdir(REPO)  # the committed report names its inputs relative to the repository
    gate_dir = Path("docs/study-real/gate")
    sweeps = [gate_dir / "runs", *sorted(gate_dir.glob("confirm*"))]
    fresh = gate(sweeps, "docs/real-model/learn-run/eval-before.json", gate_dir / "evals")
    fresh = json.loads(json.dumps(json_safe(fresh)))
    assert fresh == json.loads((gate_dir / "gate.json").read_text(encoding="utf-8"))
    text = report_text(fresh)
    assert (gate_dir / "gate.md").read_text(encoding="utf-8") == text + "\n"
    doc = (REPO / "docs" / "study-real.md").read_text(encoding="utf-8").splitlines()
    table = [line for line in text.splitlines() if line.startswith("|")]
    power_rows = 4 if "power" in fresh else 0
    assert len(table) == 2 + len(fresh["runs"]) + power_rows and all(line in doc for line in table)
    assert fresh["choice"]["not_confirmed"] == [1e-5, 5e-6]  # seed 102 degrades at both
    if fresh["choice"]["status"] == "pending":
        assert fresh["choice"]["lr"] == 2e-6 and not (REPO / "configs/study-real.yaml").exists()
    else:
        assert fresh["choice"]["status"] == "chosen"
        judged = yaml.safe_load((REPO / "configs/study-real.yaml").read_text(encoding="utf-8"))
        assert float(judged["base"]["train"]["lr"]) == fresh["choice"]["lr"]
        assert judged["seeds"] == list(range(fresh["power"]["judged_seeds"]))
