"""The response-entropy summary of a sweep: groups, shares and the clip flag per arm."""

from __future__ import annotations

import json

import pytest

from fp8rl.study.response_entropy import main, response_entropy, seed_stats


def _run(folder, rows, clip_source="fp8"):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"loss": {"clip_source": clip_source}}))
    (folder / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, entropy, adv, fp8, bf16=False, length=10):
    return {
        "step": step,
        "entropy": entropy,
        "length": length,
        "adv": adv,
        "lower_clip_fp8": fp8,
        "lower_clip_bf16": bf16,
    }


def test_seed_stats_by_hand():
    rows = [_row(0, 9.0, -1, True)]  # step 0 is left out
    rows += [_row(1, e, -1, e > 2.5, length=int(10 * e)) for e in (1.0, 2.0, 3.0, 4.0)]
    rows += [_row(1, 5.0, +1, False)]  # positive: never a lower clip, not counted
    s = seed_stats(rows, "lower_clip_fp8")
    assert (s["n_clipped"], s["n_unclipped"]) == (2, 2)
    assert s["entropy_clipped"] == pytest.approx(3.5) and s["entropy_unclipped"] == pytest.approx(
        1.5
    )
    assert s["clipped_share"] == 0.5 and s["top10_clipped_share"] == 1.0  # the top one: 4.0
    assert (s["length_clipped"], s["length_unclipped"]) == (35.0, 15.0)


def test_arms_use_the_flag_of_their_clip_decision(tmp_path, capsys):
    rows = [_row(1, 1.0, -1, True, False), _row(1, 2.0, -1, False, True)]
    for seed in (0, 1):
        _run(tmp_path / "fp8" / f"seed-{seed}", rows)
        _run(tmp_path / "fp8-oracle" / f"seed-{seed}", rows, clip_source="bf16")
    stats = response_entropy(tmp_path)
    assert stats["fp8"]["entropy_clipped"]["mean"] == 1.0
    assert stats["fp8-oracle"]["entropy_clipped"]["mean"] == 2.0
    assert stats["fp8"]["clipped_share"]["se"] == 0.0
    assert main([str(tmp_path)]) == 0
    assert "| fp8-oracle |" in capsys.readouterr().out
    assert (tmp_path / "response_entropy.png").stat().st_size > 5000
    assert main([str(tmp_path / "nothing")]) == 2


def test_arm_table_pairs_by_seed(tmp_path, capsys):
    from fp8rl.study.arm_table import main as table_main

    def arm(rewards):
        return {"seeds": [0, 1, 2], "final": {"reward_final": {"per_seed": rewards}}, "metrics": {}}

    agg = {"arms": {"bf16": arm([0.5, 0.6, 0.7]), "fp8": arm([0.4, 0.6, 0.65])}}
    (tmp_path / "aggregate.json").write_text(json.dumps(agg))
    assert table_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| reward, last 10 steps | 0.600 ± 0.058 | 0.550 ± 0.076 |" in out
    # paired: differences -0.1, 0, -0.05: mean -0.05, SE 0.029
    assert "| reward, last 10 steps | - | -0.050 ± 0.029 |" in out


def test_ratio_error_tails_against_a_gaussian(tmp_path):
    import math

    import torch

    from fp8rl.config import config_from_dict
    from fp8rl.study.ratio_errors import collect_errors, tail_stats
    from helpers_config import tiny_config

    g = torch.Generator().manual_seed(0)
    gauss = tail_stats(torch.randn(200_000, generator=g, dtype=torch.float64) * 0.05)
    assert abs(gauss["excess_kurtosis"]) < 0.1
    t = gauss["tails"]["0.1"]
    assert t["measured"] == pytest.approx(t["gaussian"], rel=0.05)  # 2 sd: 4.6 %
    assert t["gaussian"] == pytest.approx(math.erfc(2 / math.sqrt(2)), rel=0.05)
    spiky = torch.zeros(10_000, dtype=torch.float64)
    spiky[:10] = 1.0  # a few large errors: the shape FP8's has
    s = tail_stats(spiky)
    assert s["excess_kurtosis"] > 100 and s["tails"]["0.223"]["measured"] == 1e-3
    # tensorwise scales follow how a batch is cut: old log-probs in micro-batches of 2, the
    # update's on whole mini-batches, so FP8's ratio differs from the shadow's even at step 0
    train = {"steps": 1, "precision": "fp8-tensorwise", "logprob_micro_batch_size": 2}
    cfg = config_from_dict(tiny_config(tmp_path, train=train))
    e = collect_errors(cfg, steps=1)
    assert e.numel() > 0 and torch.isfinite(e).all() and e.abs().max() > 0  # FP8 vs shadow
