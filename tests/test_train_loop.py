"""The step loop end to end on a tiny Qwen3: every loss mode, NaN skipping, resume after kill."""

import json

import pytest
import torch

from fp8rl.config import config_from_dict
from fp8rl.train.runlog import read_metrics
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_runs import killed_and_resumed, strip_times, warm_started
from helpers_step import parity_reward

MODES = ["grpo", "dapo", "cispo", "bapo", "relax_lower", "calibrated", "gspo", "gspo_calibrated"]
CALIBRATED = ("calibrated", "gspo_calibrated")


@pytest.mark.parametrize("mode", MODES)
def test_each_loss_mode_runs_and_updates_weights(tmp_path, mode):
    steps = 3 if mode in CALIBRATED else 2
    cfg = config_from_dict(
        tiny_config(
            tmp_path, loss={"mode": mode, "dynamic_sampling": False}, train={"steps": steps}
        )
    )
    trainer = parity_reward(Trainer(cfg))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    rows = trainer.fit()
    assert len(rows) == steps and [r["step"] for r in read_metrics(tmp_path)] == list(range(steps))
    for r in rows:
        for key in (
            "rollout/reward",
            "rollout/entropy",
            "actor/loss",
            "actor/clipfrac_lower_neg",
            "actor/clipfrac_upper_pos",
            "mismatch/kl_rollout_train",
            "calib/lower",
            "calib/upper",
        ):
            assert isinstance(r.get(key), float), (mode, key)
    changed = any(
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )
    assert changed, f"{mode}: no update reached the weights"
    nominal = (1 - 3e-4, 1 + 4e-4) if mode.startswith("gspo") else (0.8, 1.2)
    seq = [k for r in rows for k in r if k.startswith("shadow/seq_")]
    assert bool(seq) is (mode == "gspo_calibrated")  # GSPO's shadow steps log them
    if mode in CALIBRATED:  # shadow passes ran every step; refits from step 1 (pooled rule)
        assert all(isinstance(r.get("shadow/nmae_prob"), float) for r in rows)
        assert (
            "calib/alpha" not in rows[0] and "calib/alpha" in rows[1] and "calib/alpha" in rows[2]
        )
        assert [r["calib/pool_steps"] for r in rows[1:]] == [1.0, 2.0]  # step 0 never pooled
        # each row logs the bounds its loss used; the refit's output is the next step's
        for r in rows[:2]:
            assert (r["calib/lower"], r["calib/upper"]) == pytest.approx(nominal)
        assert rows[2]["calib/lower"] == rows[1]["calib/next_lower"]
        assert rows[2]["calib/upper"] == rows[1]["calib/next_upper"]
    if mode == "gspo_calibrated":  # the pool holds responses: 4 prompts x 4 samples a step
        assert 0 < rows[1]["calib/n_neg"] + rows[1]["calib/n_pos"] <= 16
        assert rows[2]["calib/n_neg"] + rows[2]["calib/n_pos"] <= 32


def test_diagnostics_only_keeps_bounds_and_reports_shadow_metrics(tmp_path):
    cfg = config_from_dict(
        tiny_config(tmp_path, calibration={"interval": 1, "diagnostics": True, "min_tokens": 2})
    )
    rows = parity_reward(Trainer(cfg)).fit()
    assert len(rows) == 2
    for r in rows:
        assert r["calib/lower"] == pytest.approx(0.8) and r["calib/upper"] == pytest.approx(1.2)
        assert r["shadow/nmae_prob"] > 0  # FP8 vs its high-precision shadow: really different
        assert "calib/alpha" not in r


def test_nan_loss_skips_the_update_and_is_logged(tmp_path, monkeypatch):
    from fp8rl.step import update as step_mod

    real = step_mod.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 1 else loss), metrics

    monkeypatch.setattr(step_mod, "policy_loss", poisoned)
    cfg = config_from_dict(
        tiny_config(
            tmp_path,
            train={"steps": 1, "mini_batches": 2, "precision": "bf16"},
            rollout={"precision": "bf16"},
        )
    )
    trainer = parity_reward(Trainer(cfg))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rows = trainer.fit()
    assert rows[0]["train/skipped_updates"] == 1.0 and rows[0]["train/updates"] == 2.0
    assert trainer.skipped_updates == 1
    assert "update skipped" in (tmp_path / "events.log").read_text()
    for k, v in trainer.model.state_dict().items():
        assert torch.isfinite(v).all(), k
    # the second (clean) update did move the weights
    assert any(not torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())


@pytest.mark.parametrize("mode", ["calibrated"])
def test_resume_after_kill_gives_identical_metrics(tmp_path, mode):
    """Kill a CLI run with SIGKILL mid-way, resume it, and compare with an uninterrupted run."""
    steps = 10
    data = tiny_config(
        tmp_path / "x",
        loss={"mode": mode},
        train={"steps": steps, "lr": 1e-3, "mini_batches": 2},
        # shadow passes every step, refits every 3: the pool spans the kill
        calibration={"interval": 3, "shadow_every": 1, "min_tokens": 2, "pool_min_clips": 10**6},
        log={"checkpoint_every": 2, "eval_size": 0},
    )
    data["model"]["init_weights"] = str(warm_started(tmp_path / "warm.safetensors", data, steps=80))
    cfg_path = tmp_path / "cfg.json"  # JSON is YAML
    cfg_path.write_text(json.dumps(data))
    runs = killed_and_resumed(cfg_path, tmp_path, steps=steps, kill_after=5, timeout=120)
    a, b = (strip_times(rows) for rows in runs)
    assert [r["step"] for r in b] == list(range(steps))
    assert a == b
    assert [r.get("calib/pool_steps") for r in a if "calib/pool_steps" in r] == [3.0, 5.0, 5.0]
    # the runs really trained (a warm start gives mixed rewards, hence gradients)
    assert sum(r["actor/grad_norm"] > 0 for r in a) >= 2


def test_entropy_surge_is_flagged_in_metrics_and_events(tmp_path):
    from fp8rl.train.runlog import EntropySurgeDetector

    cfg = config_from_dict(
        tiny_config(tmp_path, rollout={"precision": "bf16"}, train={"precision": "bf16"})
    )
    trainer = parity_reward(Trainer(cfg))
    # a hair-trigger detector: any positive entropy after one step of history is a "surge"
    trainer.surge = EntropySurgeDetector(factor=1e-6, window=3, min_history=1)
    rows = trainer.fit()
    assert [r["rollout/entropy_surge"] for r in rows] == [0.0, 1.0]
    assert "step 1: entropy surge" in (tmp_path / "events.log").read_text()


def test_malformed_frac_is_the_steps_share_of_malformed_responses(tmp_path):
    from fp8rl.tasks import RewardResult

    trainer = Trainer(config_from_dict(tiny_config(tmp_path)))
    flags = []

    def reward(text, sample):
        # parsed everywhere, so the rate comes from "malformed" alone, not its default
        flags.append(len(text) % 2 == 1)
        return RewardResult(
            float(sum(map(ord, text)) % 2), {"parsed": True, "malformed": flags[-1]}
        )

    trainer.task.reward = reward
    rows = trainer.fit()
    # 4 prompts x 4 responses a step, scored in order: the first 16 calls are step 0's
    per_step = [flags[:16], flags[16:32]]
    assert [r["rollout/malformed_frac"] for r in rows] == [sum(f) / 16 for f in per_step]
    assert all(r["rollout/parsed_frac"] == 1.0 for r in rows)


def test_each_garble_kind_is_logged_as_the_steps_share_of_responses_showing_it(tmp_path):
    from fp8rl.tasks import RewardResult

    trainer = Trainer(config_from_dict(tiny_config(tmp_path)))
    trainer.task.garble_kinds = ("odd", "long")
    kinds = []

    def reward(text, sample):
        shown = (("odd",) if len(text) % 2 else ()) + (("long",) if len(text) > 8 else ())
        kinds.append(shown)
        return RewardResult(0.0, {"parsed": True, "malformed": bool(shown), "malformations": shown})

    trainer.task.reward = reward
    rows = trainer.fit()
    for r, step in zip(rows, (kinds[:16], kinds[16:32]), strict=True):
        for kind in ("odd", "long"):
            assert r[f"rollout/malformed_frac/{kind}"] == sum(kind in k for k in step) / 16
        assert r["rollout/malformed_frac"] == sum(bool(k) for k in step) / 16


def test_log_samples_writes_the_steps_responses_with_their_rewards_and_resume_trims(tmp_path):
    cfg = config_from_dict(tiny_config(tmp_path, train={"steps": 2}, log={"samples": 3}))
    trainer = parity_reward(Trainer(cfg))
    trainer.fit()
    rows = read_metrics(tmp_path, name="samples.jsonl")
    assert [r["step"] for r in rows] == [0, 0, 0, 1, 1, 1]
    # 4 prompts x 4 responses: rows 0, 5, 10 of the batch, so three different groups
    assert [r["index"] for r in rows[:3]] == [0, 5, 10]
    questions = {s.question: s.answer for s in trainer.task.samples("train")}
    for r in rows:
        assert questions[r["question"]] == r["answer"]
        # parity_reward: the parity of the response's character codes
        assert r["reward"] == float(sum(map(ord, r["response"])) % 2)
    # a resume from step 1 keeps step 0's rows only, then appends step 1's again
    cfg = config_from_dict(
        tiny_config(tmp_path, train={"steps": 2}, log={"samples": 3, "checkpoint_every": 1})
    )
    parity_reward(Trainer(cfg)).fit(overwrite=True)
    first = read_metrics(tmp_path, name="samples.jsonl")
    (tmp_path / "checkpoints" / "step_00000002").rename(tmp_path / "gone")
    parity_reward(Trainer(cfg)).fit(resume=True)
    assert read_metrics(tmp_path, name="samples.jsonl") == first


def test_log_samples_off_writes_no_file(tmp_path):
    Trainer(config_from_dict(tiny_config(tmp_path, train={"steps": 1}))).fit()
    assert not (tmp_path / "samples.jsonl").exists()


def test_a_direct_first_run_resumes_as_an_uninterrupted_one(tmp_path):
    """The rule rides in the checkpoint: 2 steps, resumed to 4, log what 4 steps log, and
    the first refit (step 1) goes straight to its targets, later ones move by the caps."""
    sections = dict(
        loss={"mode": "calibrated"},
        train={"steps": 4},
        calibration={"rule": "direct-first", "shadow_every": 1, "min_tokens": 2},
    )

    def fit(out, steps, resume=False):
        data = tiny_config(out, **sections)
        data["train"]["steps"], data["log"]["checkpoint_every"] = steps, 2
        return parity_reward(Trainer(config_from_dict(data), progress=False)).fit(resume=resume)

    full = fit(tmp_path / "full", 4)
    fit(tmp_path / "part", 2)
    resumed = fit(tmp_path / "part", 4, resume=True)
    assert len(full) == 4 and strip_times(read_metrics(tmp_path / "part")) == strip_times(full)
    assert resumed and resumed[-1]["step"] == 3
    saved = tmp_path / "part" / "checkpoints" / "step_00000002" / "state.json"
    assert json.loads(saved.read_text(encoding="utf-8"))["calibration"]["rule"] == "direct-first"
    # a row logs the bounds its step clipped at (calib/lower, calib/upper) and its refit's
    # targets: step 1's refit sets the bounds of step 2 on
    first = full[1]
    assert abs(first["calib/upper_target"] - 1.2) > 0.1  # pooled's cap would have held it
    assert first["calib/updated"] == 1.0 and (first["calib/lower"], first["calib/upper"]) == (
        0.8,
        1.2,
    )
    assert (full[2]["calib/lower"], full[2]["calib/upper"]) == (
        first["calib/lower_target"],
        first["calib/upper_target"],
    )
    bounds = [(r["calib/lower"], r["calib/upper"]) for r in full[2:]]
    assert len(bounds) == 2
    (l_a, h_a), (l_b, h_b) = bounds
    assert abs(l_b - l_a) <= 0.05 + 1e-12 and abs(h_b - h_a) <= 0.1 + 1e-12
