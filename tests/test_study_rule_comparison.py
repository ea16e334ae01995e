"""Issue 45's rule choice and judged comparison (study/rule_comparison.py) on constructed
sweeps whose ratios, differences and degradations are known by hand, its statistics
(Fieller's ratio interval, Fisher's exact test) against textbook values and their defining
property, and its refusals: a missing arm, a NaN, an unfinished run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from fp8rl.errors import Fp8rlError
from fp8rl.study import rule_comparison as rc
from fp8rl.study.run_checks import IncompleteRunsError
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.study.sweep.stats import fieller_ratio, fisher_exact, t_quantile
from fp8rl.utils import json_safe

STEPS = 300


def _sweep(out, arms, seeds, row):
    """row(arm, seed, step) -> that step's metrics (step added)."""
    spec = load_spec(
        {"base": {"train": {"steps": STEPS}}, "arms": {a: {} for a in arms}, "seeds": seeds}
    )
    out.mkdir(parents=True)
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        rows = [{"step": s, **row(arm, seed, s)} for s in range(STEPS)]
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (folder / "done.json").write_text(json.dumps({"wall_s": 1.0, "steps": STEPS}))
    return out


def _base(reward=0.2):
    return {"rollout/reward": reward, "rollout/entropy": 0.2, "rollout/malformed_frac": 0.0}


def _dip(step: int) -> float:
    """A reward that falls 0.2 below its best at step 100 and stays: a reward_drop."""
    return 0.3 if step < 100 else 0.1


EXCESS = {"matched": 0.03, "matched-direct-first": 0.003, "matched-noise-scaled": 0.006}


def _choice_row(arm, seed, step):
    row = _base(_dip(step) if (arm, seed) in DIPPED else 0.2 + 0.001 * seed)
    if step % 20 == 0 and step > 0:
        row["shadow/lower_clip_excess"] = EXCESS.get(arm, 0.0) * (1 + 0.1 * (seed % 100))
    return row


DIPPED: set = set()


def test_windows_hold_the_shadow_steps_a_refit_has_set():
    assert rc.shadow_steps(STEPS) == list(range(40, 300, 20))
    assert [(lo, hi, s) for lo, hi, s in rc.windows(STEPS)] == [
        (0, 49, [40]),
        (50, 99, [60, 80]),
        (100, 149, [100, 120, 140]),
        (150, 199, [160, 180]),
        (200, 249, [200, 220, 240]),
        (250, 299, [260, 280]),
    ]


def test_the_choice_by_hand(tmp_path, capsys):
    band = _sweep(tmp_path / "band", ["bf16"], [0, 1], lambda a, s, t: _base())
    out = _sweep(tmp_path / "s", ["matched", *rc.CANDIDATES], [100, 101, 102], _choice_row)
    assert rc.main(["choose", str(out), "--band", str(band)]) == 0
    r = json.loads((out / "rule-choice.json").read_text())
    # every run's excess scales by (1 + 0.1 (seed - 100)) alike, so R is the ratio of the levels
    assert r["arms"]["matched-direct-first"]["excess_ratio"] == pytest.approx(0.1)
    assert r["arms"]["matched-noise-scaled"]["excess_ratio"] == pytest.approx(0.2)
    assert r["arms"]["matched"]["excess_per_seed"]["101"] == pytest.approx(0.033)
    assert r["chosen"] == "matched-direct-first"
    assert "Chosen by the protocol's rule: `matched-direct-first`" in capsys.readouterr().out


def test_two_dipping_runs_put_a_candidate_out(tmp_path):
    DIPPED.update({("matched-direct-first", 100), ("matched-direct-first", 102)})
    try:
        band = _sweep(tmp_path / "band", ["bf16"], [0], lambda a, s, t: _base())
        out = _sweep(tmp_path / "s", ["matched", *rc.CANDIDATES], [100, 101, 102], _choice_row)
        r = rc.choose(out, band)
    finally:
        DIPPED.clear()
    assert sorted(r["arms"]["matched-direct-first"]["degraded"]) == [100, 102]
    # the 10-step trailing mean is 0.3 - 0.02 (t - 99) from step 100: more than 0.1 below the
    # best from step 105; the 20th such step fires
    assert r["arms"]["matched-direct-first"]["degraded"][100] == {"reward_drop": 124}
    assert r["chosen"] == "matched-noise-scaled"


def _table(r_df, r_ns, reward_df=0.2, reward_ns=0.2, dips_df=0, dips_ns=0):
    def row(ratio, reward, dips):
        return {
            "excess_ratio": ratio,
            "reward_last": {"mean": reward},
            "degraded": {s: {"reward_drop": 1} for s in range(dips)},
        }

    return {
        "matched-direct-first": row(r_df, reward_df, dips_df),
        "matched-noise-scaled": row(r_ns, reward_ns, dips_ns),
    }


def test_pick_follows_the_protocols_ties():
    assert rc.pick(_table(0.30, 0.10)) == "matched-noise-scaled"  # R apart by >= 0.05
    assert rc.pick(_table(0.12, 0.10, reward_df=0.21)) == "matched-direct-first"  # reward
    assert rc.pick(_table(0.10, 0.12, reward_ns=0.21)) == "matched-noise-scaled"
    assert rc.pick(_table(0.12, 0.10, reward_ns=0.203)) == "matched-direct-first"  # both tie
    assert rc.pick(_table(0.5, 0.1, dips_ns=2)) == "matched-direct-first"  # out by its dips
    with pytest.raises(Fp8rlError, match="every candidate"):
        rc.pick(_table(0.1, 0.1, dips_df=2, dips_ns=3))


JUDGED = ["bf16", "matched", "matched-calibrated", "matched-new", "matched-oracle"]
SEEDS7 = list(range(10, 17))


def _judged_row(new_excess=0.001, new_reward=lambda seed: 0.2, dips=()):
    levels = {"matched": 0.03, "matched-calibrated": 0.008, "matched-new": new_excess}

    def row(arm, seed, step):
        reward = new_reward(seed) if arm == "matched-new" else 0.2
        r = _base(_dip(step) if (arm, seed) in dips else reward)
        if step % 20 == 0 and step > 0:
            # vanilla's excess varies over seeds, so its mean is away from 0 with an interval
            r["shadow/lower_clip_excess"] = levels.get(arm, 0.0) * (1 + 0.05 * (seed % 3))
        return r

    return row


def test_the_judged_comparison_by_hand(tmp_path):
    out = _sweep(tmp_path / "j", JUDGED, SEEDS7, _judged_row())
    r = rc.judge(out)
    new = r["new"]
    # the new rule's excess is vanilla's x 1/30 at every seed: the ratio and its interval
    assert all(w["ratio"] == pytest.approx(1 / 30) for w in new["t1_windows"])
    assert all(w["ci"] == pytest.approx([1 / 30, 1 / 30]) for w in new["t1_windows"])
    assert new["t1_met"] and new["t2_met"] and new["t3_met"]
    assert new["t2_reward_minus_oracle"]["mean"] == pytest.approx(0.0)
    assert r["pooled"]["t1_windows"][0]["ratio"] == pytest.approx(0.008 / 0.03)
    assert not r["pooled"]["t1_met"]
    assert r["verdict"] == "the new rule wins"


@pytest.mark.parametrize(
    "row, failed",
    [
        (_judged_row(new_excess=0.006), "t1_met"),  # 20 % of vanilla's
        (_judged_row(new_reward=lambda s: 0.2 + 0.04 * (-1) ** s), "t2_met"),  # too wide
        (_judged_row(new_reward=lambda s: 0.17), "t2_met"),  # 0.03 below the oracle
        # the oracle dips with them, so the reward difference stays 0
        (
            _judged_row(dips={(a, s) for a in ("matched-new", "matched-oracle") for s in (10, 11)}),
            "t3_met",
        ),
    ],
)
def test_each_target_fails_alone(tmp_path, row, failed):
    r = rc.judge(_sweep(tmp_path / "j", JUDGED, SEEDS7, row))
    assert [k for k in ("t1_met", "t2_met", "t3_met") if not r["new"][k]] == [failed]
    assert r["verdict"] == "the new rule does not win"


def test_dips_are_counted_and_tested_against_vanilla_and_pooled(tmp_path):
    dips = {("matched-new", 10), ("matched", 10), ("matched", 11), ("matched", 12)}
    r = rc.judge(_sweep(tmp_path / "j", JUDGED, SEEDS7, _judged_row(dips=dips)))
    assert list(r["new"]["t3_degraded"]) == [10] and r["new"]["t3_met"]
    assert r["new"]["t3_fisher_p"]["matched"] == pytest.approx(fisher_exact(1, 7, 3, 7))
    assert r["new"]["t3_fisher_p"]["matched-calibrated"] == pytest.approx(1.0)
    assert sorted(r["degraded"]["matched"]) == [10, 11, 12]


def test_a_nan_a_missing_arm_or_an_unfinished_run_is_no_verdict(tmp_path):
    def nan_row(arm, seed, step):
        r = _judged_row()(arm, seed, step)
        if arm == "matched-new" and seed == 12 and step == 120:
            r["shadow/lower_clip_excess"] = math.nan
        return r

    with pytest.raises(IncompleteRunsError, match="step 120 has no finite"):
        rc.judge(_sweep(tmp_path / "nan", JUDGED, SEEDS7, nan_row))
    with pytest.raises(Fp8rlError, match="no arm matched-oracle"):
        rc.judge(_sweep(tmp_path / "arm", JUDGED[:-1], SEEDS7, _judged_row()))
    out = _sweep(tmp_path / "done", JUDGED, SEEDS7, _judged_row())
    (run_dir(out, "matched-new", 13) / "done.json").unlink()
    with pytest.raises(IncompleteRunsError, match="not finished"):
        rc.judge(out)
    with pytest.raises(IncompleteRunsError, match="at least 7"):
        rc.judge(_sweep(tmp_path / "few", JUDGED, SEEDS7[:5], _judged_row()))
    assert not (out / "rule-comparison.json").exists()


# --- the statistics ---


def test_fisher_exact_against_textbook_values():
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)  # the lady tasting tea
    # 1 of 12 men dieting against 9 of 12 women (the textbook example): p = 0.002759
    assert fisher_exact(1, 12, 9, 12) == pytest.approx(0.002759, abs=5e-7)
    assert fisher_exact(0, 7, 0, 7) == 1.0
    assert fisher_exact(4, 10, 1, 20) == pytest.approx(fisher_exact(1, 20, 4, 10))


def _t_at(num, den, ratio):
    d = [a - ratio * b for a, b in zip(num, den, strict=True)]
    n = len(d)
    m = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in d) / (n - 1))
    return m / (sd / math.sqrt(n))


def test_fieller_interval_is_where_the_paired_t_test_does_not_reject():
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(3, 9)
        den = [3.0 + rng.gauss(0, 0.3) for _ in range(n)]
        num = [0.2 * b + rng.gauss(0, 0.05) for b in den]
        f = fieller_ratio(num, den)
        t = t_quantile(0.975, n - 1)
        lo, hi = f["ci"]
        assert lo < f["ratio"] < hi
        assert abs(_t_at(num, den, lo)) == pytest.approx(t, rel=1e-6)
        assert abs(_t_at(num, den, hi)) == pytest.approx(t, rel=1e-6)
        assert abs(_t_at(num, den, (lo + f["ratio"]) / 2)) < t


def test_fieller_with_a_constant_denominator_is_the_numerators_interval_scaled():
    num, den = [0.1, 0.2, 0.15, 0.12], [2.0] * 4
    f = fieller_ratio(num, den)
    m = sum(num) / 4
    se = math.sqrt(sum((x - m) ** 2 for x in num) / 3 / 4)
    t = t_quantile(0.975, 3)
    assert f["ci"] == pytest.approx([(m - t * se) / 2, (m + t * se) / 2])


def test_fieller_has_no_interval_when_the_denominator_may_be_zero():
    assert fieller_ratio([0.1, 0.2, 0.1], [0.5, -0.4, 0.1])["ci"] is None
    with pytest.raises(ValueError):
        fieller_ratio([0.1, math.nan], [1.0, 1.0])


# what rl/shadow.py logs at a shadow step whose batch has no negative-advantage token
NO_NEGATIVES = {
    "shadow/lower_clip_excess": None,
    "shadow/lower_clipfrac_neg_fp8": None,
    "shadow/clipfrac_lower_neg_fp8": 0.0,
    "shadow/clipfrac_lower_neg_bf16": 0.0,
}


def test_a_shadow_step_without_negative_tokens_is_left_out_not_a_refusal(tmp_path):
    def row(arm, seed, step):
        r = _judged_row()(arm, seed, step)
        if step % 20 == 0 and step > 0:
            r["shadow/nmae_prob"] = 0.03
        if arm == "matched-new" and seed == 12 and step in (120, 140):
            r.update(NO_NEGATIVES)
        return r

    r = rc.judge(_sweep(tmp_path / "j", JUDGED, SEEDS7, row))
    # seed 12's window 100-149 rests on step 100 alone, whose excess is vanilla's / 30 as ever
    assert r["new"]["t1_windows"][2]["ratio"] == pytest.approx(1 / 30)

    def empty(arm, seed, step):
        r = row(arm, seed, step)
        if arm == "matched-new" and seed == 12 and step == 100:
            r.update(NO_NEGATIVES)
        return r

    with pytest.raises(IncompleteRunsError, match="no step of \\[100, 120, 140\\] defines"):
        rc.judge(_sweep(tmp_path / "e", JUDGED, SEEDS7, empty))


DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_committed_choice_recomputes_from_the_committed_runs():
    rules = DOCS / "study-matched" / "rules"
    committed = json.loads((rules / "rule-choice.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(json_safe(rc.choose(rules, DOCS / "study-matched" / "runs"))))
    assert fresh == committed and fresh["chosen"] == "matched-noise-scaled"
    text = rc.choose_md(fresh)
    assert (rules / "rule-choice.md").read_text(encoding="utf-8") == text + "\n"
    doc = (DOCS / "study-matched.md").read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 5 and all(line in doc.splitlines() for line in table)
    judged = yaml.safe_load(
        (DOCS.parent / "configs" / "study-matched-rules-judged.yaml").read_text()
    )
    assert judged["arms"]["matched-new"]["calibration"]["rule"] == "noise-scaled"


def test_the_committed_verdict_recomputes_from_the_committed_runs():
    judged = DOCS / "study-matched" / "rules-judged"
    committed = json.loads((judged / "rule-comparison.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(json_safe(rc.judge(judged))))
    assert fresh == committed and fresh["verdict"] == "the new rule does not win"
    assert not (fresh["new"]["t1_met"] or fresh["new"]["t2_met"] or fresh["new"]["t3_met"])
    text = rc.judge_md(fresh)
    assert (judged / "rule-comparison.md").read_text(encoding="utf-8") == text + "\n"
    doc = (DOCS / "study-matched.md").read_text(encoding="utf-8").splitlines()
    table = [line for line in text.splitlines() if line.startswith(("|", "- "))]
    assert len(table) == 2 * 8 + 2 * 3 + 3 and all(line in doc for line in table)
