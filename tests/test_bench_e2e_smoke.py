"""bench/gpu_e2e.py: the CPU smoke mode runs end to end and writes sane JSON; its checks can
fail."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "gpu_e2e.py"


def _bench_module():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import gpu_e2e

    return gpu_e2e


def _pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--profile", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_smoke_json_has_every_part(smoke):
    res, stdout = smoke
    for key in (
        "meta",
        "smoke",
        "command",
        "settings",
        "shapes",
        "checks",
        "train",
        "rollout",
        "grpo",
        "goals",
        "profile",
        "timings_s",
        "errors",
        "passed",
        "gpu_numbers_measured",
        "total_s",
    ):
        assert key in res, key
    assert res["smoke"] is True and res["gpu_numbers_measured"] is False
    assert res["passed"] is True and res["errors"] == {}
    for key in ("date", "card", "torch", "transformers", "device", "check_finite"):
        assert key in res["meta"], key
    assert "GPU numbers are still to be measured" in stdout


def test_smoke_checks_passed_and_fp8_really_ran(smoke):
    checks = smoke[0]["checks"]
    assert checks["passed"] and checks["fp8_linear_vs_emulation"]
    assert len(checks["model"]) == 6 and all(i["passed"] for i in checks["model"])
    for item in checks["model"]:
        err = item.get("rel_err", item.get("fp8_vs_high_precision_cpu"))
        assert 1e-3 < err < 0.5, item


def test_smoke_training_figures_are_consistent(smoke):
    train = smoke[0]["train"]
    m, tokens = train["mini_batches"], train["tokens_per_mini_batch"]
    assert train["tokens_per_step"] == m * tokens
    assert _pos(train["calibrate_ms"])
    measured = [r for r in train["rows"] if not r["projected"]]
    assert len(measured) == 4 * len(train["depths"])
    for r in train["rows"]:
        for key in (
            "forward_ms",
            "update_ms",
            "step_ms",
            "update_tok_s",
            "step_tok_s",
            "step_calibrated_tok_s",
        ):
            assert _pos(r[key]), (key, r)
        assert r["step_ms"] == pytest.approx(m * (r["forward_ms"] + r["update_ms"]))
        assert r["step_tok_s"] == pytest.approx(m * tokens / r["step_ms"] * 1e3)
        if r["precision"] == "bf16":
            assert r["calib_ms_per_step"] == 0 and r["speedup_calibrated"] == pytest.approx(1.0)
        else:  # calibration costs something, and the calibrated throughput is lower
            assert _pos(r["calib_ms_per_step"]) and _pos(r["calib_overhead"])
            assert r["step_calibrated_tok_s"] < r["step_tok_s"]
            assert _pos(r["speedup_calibrated"])
    for d in train["depths"]:
        assert d["losses_finite"] and _pos(d["shadow_forward_ms"]) and d["params"] > 0


def test_smoke_rollout_and_mismatch(smoke):
    roll = smoke[0]["rollout"]
    assert roll["batch"] == 64
    assert {(r["model"], r["precision"]) for r in roll["rows"]} == {
        (m, p) for m in ("1b", "8b") for p in ("bf16", "tensorwise", "rowwise", "blockwise")
    }
    for r in roll["rows"]:
        assert _pos(r["tok_s"]) and _pos(r["speedup"]) and r["finite"], r
    for model in ("1b", "8b"):  # FP8 rollouts mismatch a high-precision trainer far more than bf16
        k3 = {
            r["precision"]: r["k3_vs_high_precision"] for r in roll["rows"] if r["model"] == model
        }
        assert all(
            k3[p] > 10 * max(k3["bf16"], 1e-9) for p in ("tensorwise", "rowwise", "blockwise")
        ), k3


def test_smoke_grpo_run_and_goals(smoke):
    res = smoke[0]
    grpo = res["grpo"]
    assert grpo["passed"] and all(grpo["checks"].values())
    assert grpo["steps"] == res["settings"]["grpo_steps"]
    assert grpo["shadow_steps"] == list(range(0, grpo["steps"], grpo["interval"]))
    assert _pos(grpo["step_s_median"]) and grpo["params"] > 0 and grpo["skipped_updates"] == 0
    goals = res["goals"]
    assert len(goals) == 3 + 3 + 6
    assert all(g["met"] is None for g in goals)  # never judged on the CPU
    assert res["profile"] and all(p["table"] and p["top"] for p in res["profile"].values())


def test_goal_judgement_and_step_arithmetic():
    e = _bench_module()
    fig = e.step_figures(fwd=10.0, upd=30.0, shadow=8.0, calib=4.0, m=4, interval=20, tokens=1000)
    assert fig["step_ms"] == pytest.approx(160.0)
    assert fig["calib_ms_per_step"] == pytest.approx((2 * 4 * 8.0 + 4.0) / 20)
    assert fig["calib_overhead"] == pytest.approx(3.4 / 160.0)
    assert fig["step_calibrated_tok_s"] == pytest.approx(4000 / 163.4 * 1e3)
    rows = [
        {
            "projected": True,
            "layers": 36,
            "precision": "tensorwise",
            "speedup_calibrated": 1.49,
            "calib_overhead": 0.01,
        },
        {
            "projected": True,
            "layers": 36,
            "precision": "rowwise",
            "speedup_calibrated": 1.36,
            "calib_overhead": 0.06,
        },
    ]
    train = {"rows": rows, "depths": [{"layers": 1}, {"layers": 4}], "interval": 20}
    roll = {"batch": 64, "rows": [{"model": "1b", "precision": "rowwise", "speedup": 1.25}]}
    met = {g["goal"]: g["met"] for g in e.judge(train, roll, judged=True)}
    assert met == {
        "train step tensorwise (calibration included) vs bf16": False,
        "train step rowwise (calibration included) vs bf16": True,
        "calibration overhead tensorwise at interval 20": True,
        "calibration overhead rowwise at interval 20": False,
        "rollout 1b rowwise vs bf16": True,
    }


def test_a_broken_fp8_path_fails_the_checks(monkeypatch, tmp_path):
    """If the recipes silently did nothing (FP8 never ran), the run stops before any timing."""
    import torch

    e = _bench_module()
    monkeypatch.setattr(e.checks, "use_recipe", lambda model, recipe: e.high_precision(model))
    out = tmp_path / "broken.json"
    threads = torch.get_num_threads()
    try:
        assert e.main(["--smoke", "--only", "train", "--out", str(out)]) == 1
    finally:
        torch.set_num_threads(threads)  # main sets --threads and the quantizer for its process
        from fp8rl.fp8 import fused

        fused.configure()
    res = json.loads(out.read_text())
    assert res["passed"] is False and res["checks"]["passed"] is False and res["train"] is None


def test_smoke_checks_cover_odd_token_counts_and_report_the_quantizer(smoke):
    res = smoke[0]
    assert res["ran"] is True and res["completed"] is True and res["script"] == "gpu_e2e"
    layer = res["checks"]["layer"]
    assert {c["m"] for c in layer} == {256, 37, 130}
    assert all(c["passed"] and isinstance(c["error"], float) for c in layer)
    assert res["checks"]["recipes_passed"] == ["tensorwise", "rowwise", "blockwise"]
    q = res["quantizer"]  # the smoke run traces the GPU's compiled quantizer path
    assert q["keys"] and q["fallbacks"] == [] and q["max_compiles_per_key"] <= 2


def test_a_recipe_that_fails_its_check_is_left_out_and_the_others_are_timed(monkeypatch, tmp_path):
    """Only blockwise silently skips FP8 here: it fails the model check, is not timed, and its
    goals are listed as not measured; the other recipes are still timed; the exit status is 1."""
    import torch

    from fp8rl.fp8 import fused

    e = _bench_module()
    real = e.use_recipe
    monkeypatch.setattr(
        e.checks,  # the module whose checks run the recipes
        "use_recipe",
        lambda model, rec: e.high_precision(model) if rec == "blockwise" else real(model, rec),
    )
    out = tmp_path / "one_broken.json"
    threads = torch.get_num_threads()
    try:
        assert e.main(["--smoke", "--only", "train", "--out", str(out)]) == 1
    finally:
        torch.set_num_threads(threads)
        fused.configure()
    res = json.loads(out.read_text())
    assert res["checks"]["recipes_passed"] == ["tensorwise", "rowwise"] and res["passed"] is False
    assert {r["precision"] for r in res["train"]["rows"]} == {"bf16", "tensorwise", "rowwise"}
    missing = [g for g in res["goals"] if g["recipe"] == "blockwise"]
    assert missing and all(g["value"] is None and g["basis"] == "not measured" for g in missing)
    assert res["completed"] is True


class _StopAfter:
    """A budget that is spent after `n` questions (one per GRPO step)."""

    def __init__(self, n):
        self.n = n

    def out(self, reserve: float = 0.0) -> bool:
        self.n -= 1
        return self.n < 0


def test_grpo_stops_between_steps_when_its_budget_is_spent(tmp_path):
    import torch

    e = _bench_module()
    cfg = e.settings(smoke=True)
    res = e.run_grpo(torch.device("cpu"), cfg, "rowwise", "float32", str(tmp_path), _StopAfter(2))
    assert (
        res["steps"] == 2
        and res["cut_short"] == f"time budget spent after 2 of {cfg['grpo_steps']} steps"
    )
    assert res["passed"] and res["shadow_steps"] == [0]  # interval 2: step 0 of steps 0-1
    assert res["host_syncs"] is None


def test_goals_that_were_not_measured_are_listed_as_such():
    e = _bench_module()
    rows = [
        {
            "projected": False,
            "layers": 1,
            "precision": "rowwise",
            "speedup_calibrated": 1.4,
            "calib_overhead": 0.01,
        }
    ]
    train = {"rows": rows, "depths": [{"layers": 1}], "interval": 20}
    goals = e.judge(
        train, None, judged=True, expect={"recipes": ["tensorwise", "rowwise"], "models": ["1b"]}
    )
    got = {g["goal"]: (g["value"], g["met"], g["basis"]) for g in goals}
    assert got == {
        "train step rowwise (calibration included) vs bf16": (1.4, True, "measured at 1 layers"),
        "train step tensorwise (calibration included) vs bf16": (None, None, "not measured"),
        "calibration overhead rowwise at interval 20": (0.01, True, "measured at 1 layers"),
        "calibration overhead tensorwise at interval 20": (None, None, "not measured"),
        "rollout 1b tensorwise vs bf16": (None, None, "not measured"),
        "rollout 1b rowwise vs bf16": (None, None, "not measured"),
    }


def test_a_grpo_run_with_no_time_left_is_reported_not_crashed(tmp_path, capsys):
    import torch

    e = _bench_module()
    res = e.run_grpo(
        torch.device("cpu"),
        e.settings(smoke=True),
        "rowwise",
        "float32",
        str(tmp_path),
        _StopAfter(0),
    )
    assert (
        res["steps"] == 0
        and res["passed"] is False
        and res["cut_short"].endswith("after 0 of 4 steps")
    )
    e.print_grpo(res)
    assert "time budget spent after 0 of 4 steps" in capsys.readouterr().out
