"""The quick demo end to end: the embedded default job's files and summary keys."""

import json

from fp8rl.cli import main

RUNS = ("bf16", "fp8", "fp8-calibrated")
COMMON = ("reward_final", "entropy_mean", "clipfrac_lower_neg_mean", "steps", "wall_s")
FP8_ONLY = ("shadow_clipfrac_bf16_mean", "shadow_clipfrac_fp8_mean", "shadow_nmae_prob_mean",
            "shadow_amplification_mean")


def test_quick_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for run in RUNS:
        s = summary[run]
        for key in COMMON:
            assert isinstance(s[key], (int, float)), (run, key)
        assert s["steps"] == 4 and s["wall_s"] > 0
        assert 0.0 <= s["reward_final"] <= 1.0 and s["entropy_mean"] > 0
        assert 0.0 <= s["eval_final_mean@1"] <= 1.0
        for key in FP8_ONLY:
            assert (key in s) == (run != "bf16"), (run, key)
    for run in ("fp8", "fp8-calibrated"):
        # FP8 noise against the BF16 shadow of the same weights is real and small
        assert 0 < summary[run]["shadow_nmae_prob_mean"] < 0.2
        assert summary[run]["shadow_amplification_mean"] > 0
    assert summary["warm_start"]["loss_final"] < summary["warm_start"]["loss_first"]
    md = (out / "summary.md").read_text()
    assert "| fp8-calibrated |" in md and "What to look at" in md
    for png in ("reward.png", "entropy.png", "shadow_lower_clip.png", "bounds.png", "nmae.png"):
        assert (out / png).stat().st_size > 5000, png
    for run in RUNS:
        assert len((out / run / "metrics.jsonl").read_text().splitlines()) == 4
    assert "fp8rl demo (quick)" in capsys.readouterr().out
    # the warm start is cached: a second demo reuses it
    assert len(list(out.glob("warmstart-*.safetensors"))) == 1
