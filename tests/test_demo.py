"""The quick demo end to end: the embedded default job's files and summary.json's shape."""

import json
from pathlib import Path

from fp8rl.cli import main
from fp8rl.train.checkpoint import sha256_file

ARMS = ("bf16", "fp8", "fp8-calibrated-paper", "fp8-calibrated")
COMMON = (
    "reward_final_mean",
    "reward_final_se",
    "entropy_mean",
    "entropy_se",
    "eval_final_mean@1_mean",
    "eval_final_mean@1_se",
    "tis_weight_mean",
    "wall_s",
)
SHADOW = (
    "lower_clip_excess_mean",
    "lower_clip_excess_se",
    "lower_clipfrac_neg_fp8_mean",
    "lower_clipfrac_neg_bf16_mean",
    "amplification_mean",
    "nmae_prob_mean",
)


def test_quick_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == list(ARMS)
    for arm, s in summary["runs"].items():
        assert s["seeds"] == [0, 1]
        for key in COMMON:
            assert isinstance(s[key], (int, float)), (arm, key)
        assert 0.0 <= s["reward_final_mean"] <= 1.0 and s["entropy_mean"] > 0 and s["wall_s"] > 0
        assert 0.0 <= s["eval_final_mean@1_mean"] <= 1.0
        for key in SHADOW:  # (an SE can be null when a quick seed logged no N token)
            assert (key in s) == (arm != "bf16"), (arm, key)
            if key.endswith("_mean") and arm != "bf16":
                assert isinstance(s[key], float), (arm, key)
    for arm in ARMS[1:]:
        s = summary["runs"][arm]
        # FP8 noise against the BF16 shadow of the same weights is real and small
        assert 0 < s["nmae_prob_mean"] < 0.2 and s["amplification_mean"] > 0
        # the excess is the paired difference of the two clip fractions, seed by seed
        assert (
            abs(
                s["lower_clip_excess_mean"]
                - (s["lower_clipfrac_neg_fp8_mean"] - s["lower_clipfrac_neg_bf16_mean"])
            )
            < 1e-9
        )
    # rollout rowwise, trainer tensorwise: TIS has a mismatch to correct in the FP8 arms only
    bf16, fp8 = summary["runs"]["bf16"], summary["runs"]["fp8"]
    assert abs(bf16["tis_weight_mean"] - 1) < 1e-6  # the same kernels up to float rounding
    assert fp8["kl_rollout_train_mean"] > 100 * bf16["kl_rollout_train_mean"] + 1e-9
    assert set(summary["excess_left"]) == {"fp8-calibrated-paper", "fp8-calibrated"}
    assert summary["warm_start"]["loss_final"] < summary["warm_start"]["loss_first"]
    assert 0 <= summary["warm_start"]["eval_mean@1"] <= 1
    md = (out / "summary.md").read_text()
    assert md.index("| fp8-calibrated |") < md.index("What to look at")  # the table leads
    for png in (
        "reward.png",
        "entropy.png",
        "shadow_lower_clip.png",
        "shadow_lower_clip_excess.png",
        "bounds.png",
        "tis_weight.png",
    ):
        assert (out / png).stat().st_size > 5000, png
    for arm in ARMS:
        for seed in (0, 1):
            assert len((out / arm / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()) == 4
    shown = capsys.readouterr().out
    assert "fp8rl demo (quick)" in shown and "A smoke test (4 steps x 2 seeds)" in shown
    assert "of the vanilla `fp8` excess" not in shown  # no percentages from 4 steps
    # the warm start is cached and the sweep resumes: a second demo reruns nothing
    mtime = (out / "fp8" / "seed-0" / "done.json").stat().st_mtime
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    assert (out / "fp8" / "seed-0" / "done.json").stat().st_mtime == mtime
    # every run starts from the committed warm start the summary names, by its checked sha256,
    # and the summary records the commit it was made at: no second copy next to the runs
    ws = summary["warm_start"]
    assert ws["weights"].endswith("docs/warmstarts/demo-addition.safetensors")
    assert ws["sha256"] == sha256_file(Path(ws["weights"]))
    assert (
        ws["sha256"] == json.loads(Path(ws["weights"]).with_suffix(".json").read_text())["sha256"]
    )
    assert len(summary["code"]["commit"]) == 40 and isinstance(summary["code"]["changed"], list)
    assert not list(out.rglob("*.safetensors"))
