"""The two ablations as options of `fp8rl train`: oracle clipping (loss.clip_source=bf16) and
noise injection (loss.ratio_noise), wired through the step (their config checks are
tests/test_config_validate.py's)."""

from __future__ import annotations

import json
import math

import pytest

from fp8rl.config import config_from_dict
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_step import parity_reward, step_context, step_rows

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}


def _run(tmp_path, name, **sections):
    sections.setdefault("calibration", SHADOW)
    cfg = config_from_dict(tiny_config(tmp_path / name, **sections))
    return parity_reward(Trainer(cfg, progress=False)).fit()


def _steps(**sections) -> list[dict]:
    """The rows of train.steps steps of the tiny run (shadow passes at every step)."""
    sections.setdefault("calibration", SHADOW)
    return step_rows(parity_reward(step_context(**sections)), sections["train"]["steps"])


def _close(a: dict, b: dict, prefixes, rel=1e-5):
    keys = [k for k in a if k.startswith(prefixes) and isinstance(a[k], float)]
    assert keys
    for k in keys:
        x, y = a[k], b[k]
        assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel, abs_tol=1e-9), k


def test_oracle_clipping_in_high_precision_is_ppo_clip():
    # without FP8 the shadow ratio is the training ratio: the oracle's clip decisions are PPO's
    hp = {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16", "steps": 2}}
    plain = _steps(**hp)
    oracle = _steps(loss={"clip_source": "bf16"}, **hp)
    assert len(plain) == len(oracle) == 2
    for a, b in zip(plain, oracle, strict=True):
        _close(a, b, ("rollout/", "actor/loss", "actor/grad_norm", "actor/clipfrac", "shadow/"))
        assert b["actor/oracle_flip_frac"] == 0.0


def test_oracle_clipping_in_fp8_trains_and_reports_its_flips():
    rows = _steps(loss={"clip_source": "bf16"}, train={"steps": 2})
    assert len(rows) == 2
    assert all(math.isfinite(r["actor/loss"]) and "actor/oracle_flip_frac" in r for r in rows)
    assert sum(r["train/skipped_updates"] for r in rows) == 0


def test_zero_noise_is_the_clean_run_and_noise_has_the_requested_statistics():
    hp = {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16", "steps": 2}}
    clean = _steps(**hp)
    zero = _steps(loss={"ratio_noise": {"sd": 0.0, "corr": 0.5}}, **hp)
    assert len(clean) == len(zero) == 2
    # the shadow's values differ only by how they were batched
    for a, b in zip(clean, zero, strict=True):
        _close(a, b, ("rollout/", "actor/", "mismatch/", "train/kept"))
        assert b["shadow/logprob_err_sd"] == 0.0
    noisy = _steps(
        loss={"ratio_noise": {"sd": 0.1, "corr": 0.6}},
        rollout={"precision": "bf16", "prompts_per_step": 16, "n": 8, "max_new_tokens": 8},
        train={"precision": "bf16", "steps": 2},
    )
    assert len(noisy) == 2
    for r in noisy:  # ~1000 tokens a step: a few percent of sampling error
        assert r["shadow/logprob_err_sd"] == pytest.approx(0.1, rel=0.1)
        assert r["shadow/old_new_err_corr"] == pytest.approx(0.6, abs=0.1)
    assert any(r["actor/loss"] != c["actor/loss"] for r, c in zip(noisy, clean, strict=True))


def test_auto_noise_reads_an_fp8_runs_shadow_statistics(tmp_path):
    fp8 = _run(tmp_path, "fp8", train={"steps": 3})
    s = sum(r["shadow/logprob_err_sd"] for r in fp8[1:]) / 2
    c = sum(r["shadow/old_new_err_corr"] for r in fp8[1:]) / 2
    cfg = config_from_dict(
        tiny_config(
            tmp_path / "auto",
            loss={"ratio_noise": {"auto": str(tmp_path / "fp8")}},
            train={"precision": "bf16"},
            rollout={"precision": "bf16"},
            calibration=SHADOW,
        )
    )
    trainer = Trainer(cfg, progress=False)
    assert trainer.noise == pytest.approx((s, c), rel=1e-6)
    trainer.fit()
    events = (tmp_path / "auto" / "events.log").read_text()
    assert "loss.ratio_noise: sd" in events
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["loss"]["ratio_noise"]


def test_response_stats_rows_at_shadow_steps_and_resume_drops_the_redone_steps(tmp_path):
    from fp8rl.train.runlog import read_metrics

    sections = dict(
        train={"steps": 2},
        log={"response_stats": True, "checkpoint_every": 1},
    )
    cfg = config_from_dict(tiny_config(tmp_path / "r", calibration=SHADOW, **sections))
    parity_reward(Trainer(cfg, progress=False)).fit()
    rows = read_metrics(tmp_path / "r", name="responses.jsonl")
    assert [r["step"] for r in rows] == [0] * 16 + [1] * 16  # 4 prompts x 4 samples a step
    assert all(r["length"] >= 1 and r["entropy"] >= 0 for r in rows)
    # only negative-advantage responses can be lower-clipped
    assert all(r["adv"] < 0 for r in rows if r["lower_clip_fp8"] or r["lower_clip_bf16"])
    cfg3 = config_from_dict(
        tiny_config(tmp_path / "r", calibration=SHADOW, train={"steps": 3}, log=sections["log"])
    )
    t = parity_reward(Trainer(cfg3, progress=False))
    t.fit(resume=True)
    again = read_metrics(tmp_path / "r", name="responses.jsonl")
    assert [r["step"] for r in again] == [0] * 16 + [1] * 16 + [2] * 16
    assert again[:32] == rows
