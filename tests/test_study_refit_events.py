"""study/refit_events.py: the change around a refit and its seed-paired difference by hand,
degradations matched to the refit before them, missing data refused, and the committed
refit-events.{json,md} recompute exactly from the committed matched runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fp8rl.study import refit_events as re
from fp8rl.study.run_checks import IncompleteRunsError
from fp8rl.utils import json_safe

ROOT = Path(__file__).resolve().parents[1]
MATCHED = ROOT / "docs" / "study-matched"
CAPS = (0.05, 0.1)


def _rows(n: int, reward, entropy=lambda t: 0.3) -> list[dict]:
    return [
        {"step": t, "rollout/reward": reward(t), "rollout/entropy": entropy(t)} for t in range(n)
    ]


def _mark_refit(row: dict, lower, next_lower, lower_target, upper, next_upper, upper_target):
    row.update(
        {
            "calib/updated": 1.0,
            "calib/lower": lower,
            "calib/next_lower": next_lower,
            "calib/lower_target": lower_target,
            "calib/upper": upper,
            "calib/next_upper": next_upper,
            "calib/upper_target": upper_target,
        }
    )


def _hand_pair():
    """A refit at step 10: its new bounds first touch the rollout of step 12, so K = 5 compares
    steps 12-16 with 7-11. CC's reward is t/100 (step 6 and 17 poisoned: outside the windows);
    vanilla's is 0.3 but 0.8 at step 14; CC's entropy 0.2 before step 12 and 0.26 from it."""
    cc = _rows(30, lambda t: t / 100, lambda t: 0.2 if t < 12 else 0.26)
    cc[6]["rollout/reward"] = cc[17]["rollout/reward"] = 9.0
    _mark_refit(cc[10], 0.8, 0.75, 0.15, 1.2, 1.25, 1.25)
    vanilla = _rows(30, lambda t: 0.8 if t == 14 else 0.3)
    return cc, vanilla


def test_a_refits_paired_change_by_hand():
    cc, vanilla = _hand_pair()
    out = re.refit_events(cc, vanilla, CAPS, k=5, who="hand")
    assert out["left_out"] == []
    (e,) = out["events"]
    assert e["step"] == 10 and e["first_touched"] == 12
    # CC: mean(12..16)/100 - mean(7..11)/100 = (14 - 9)/100; vanilla: 0.5 / 5 at step 14
    assert e["reward_cc"] == pytest.approx(0.05)
    assert e["reward_vanilla"] == pytest.approx(0.1)
    assert e["reward"] == pytest.approx(-0.05)
    assert e["entropy_cc"] == pytest.approx(0.06)
    assert e["entropy"] == pytest.approx(0.06)
    # the lower bound walked the full cap (0.05) and stays off its target 0.15; the upper
    # moved half its cap (0.1) and reached its target
    assert e["lower_move"] == pytest.approx(-0.05) and e["lower_capped"] is True
    assert e["lower_size"] == "down, full step" and e["lower_level"] == ">= 0.7"
    assert e["upper_move"] == pytest.approx(0.05) and e["upper_capped"] is False
    assert e["upper_size"] == "up, partial"


def test_size_and_level_groups_by_hand():
    assert re.size_group(0.0, 0.05) == "none"
    assert re.size_group(-0.02, 0.05) == "down, partial"
    assert re.size_group(0.05, 0.05) == "up, full step"
    assert [re.level_group(x) for x in (0.05, 0.3, 0.69, 0.7)] == [
        "0-0.3",
        "0.3-0.5",
        "0.5-0.7",
        ">= 0.7",
    ]


def test_group_table_means_and_standard_errors_by_hand():
    events = [
        {"g": "a", "lower_move": -0.05, "upper_move": 0.1, "lower_new": 0.6}
        | {f"{m}{p}": v for m in ("reward", "entropy") for p in ("", "_cc", "_vanilla")}
        for v in (0.01, 0.03)
    ]
    (row,) = re.group_table(events, "g", ["a", "b"])  # an empty group is left out
    assert row["n"] == 2 and row["lower_move"] == pytest.approx(-0.05)
    assert row["reward"]["mean"] == pytest.approx(0.02)
    assert row["reward"]["se"] == pytest.approx(0.01)  # sd 0.01 * sqrt(2) over sqrt(2)


def test_placebo_sits_halfway_between_refits():
    # refits at 10 and 30: the placebo of each sits 10 steps later (rollout step 22 and 42)
    cc = _rows(60, lambda t: 1.0 if t >= 22 else 0.0)
    vanilla = _rows(60, lambda t: 0.0)
    for s in (10, 30):
        _mark_refit(cc[s], 0.8, 0.75, 0.15, 1.2, 1.3, 1.8)
    out = re.placebo_changes(cc, vanilla, k=5, who="hand")
    assert [p["step"] for p in out] == [20, 40]
    assert out[0]["reward"] == pytest.approx(1.0) and out[1]["reward"] == pytest.approx(0.0)


def test_missing_or_nonfinite_data_is_an_error_not_a_result():
    cc, vanilla = _hand_pair()
    del vanilla[14]
    with pytest.raises(IncompleteRunsError, match="step 14 has no finite rollout/reward"):
        re.refit_events(cc, vanilla, CAPS, k=5, who="hand")
    cc, vanilla = _hand_pair()
    cc[9]["rollout/entropy"] = math.nan
    with pytest.raises(IncompleteRunsError, match="step 9 has no finite rollout/entropy"):
        re.refit_events(cc, vanilla, CAPS, k=5, who="hand")
    cc, vanilla = _hand_pair()
    del cc[10]["calib/next_lower"]
    with pytest.raises(IncompleteRunsError, match="step 10 has no finite calib/next_lower"):
        re.refit_events(cc, vanilla, CAPS, k=5, who="hand")
    cc, vanilla = _hand_pair()
    del cc[10]["calib/updated"]
    with pytest.raises(IncompleteRunsError, match="without a refit"):
        re.refit_events(cc, vanilla, CAPS, k=5, who="hand")


def test_a_refit_whose_window_passes_the_end_is_left_out_and_counted():
    cc, vanilla = _hand_pair()
    _mark_refit(cc[25], 0.75, 0.7, 0.15, 1.25, 1.35, 1.8)  # window 27..31 of a 30-step run
    out = re.refit_events(cc, vanilla, CAPS, k=5, who="hand")
    assert [e["step"] for e in out["events"]] == [10] and out["left_out"] == [25]


def _event(seed, step, move, level, arm="cc"):
    return {
        "arm": arm,
        "seed": seed,
        "step": step,
        "first_touched": step + re.LAG,
        "lower_move": move,
        "lower_new": level,
        "lower_capped": True,
        "lower_size": re.size_group(move, 0.05),
    }


def test_a_dip_is_matched_to_the_last_refit_before_its_onset():
    verdict = {
        "results": {
            "cells": [
                {
                    "compare": {
                        "cc": {
                            "degradation": {
                                "0": {"fired": {"reward_drop": 65}},
                                "1": {"fired": {"reward_drop": 40}},
                                "2": {"fired": {}},
                            }
                        }
                    }
                }
            ]
        }
    }
    found = re.dips(verdict, "cc")
    # the reward-drop condition holds for 20 steps when it fires: onset = fired - 19
    assert [(d["seed"], d["fired"], d["onset"]) for d in found] == [(0, 65, 46), (1, 40, 21)]
    events = [
        _event(0, 20, -0.05, 0.75),
        _event(0, 40, -0.02, 0.73),
        _event(0, 60, -0.05, 0.68),
        _event(1, 20, 0.0, 0.8),
    ]
    first, second = (re.match_dip(d, events) for d in found)
    r = first["refit"]
    # refit 40 first touched step 42 <= onset 46; refit 60 (62) comes after it
    assert r["step"] == 40 and r["steps_after"] == 4 and r["lower_size"] == "down, partial"
    # |moves| 0.05, 0.02, 0.05, 0.0: one below 0.02, one tie -> 1.5 / 4
    assert r["move_rank"] == pytest.approx(1.5 / 4)
    # levels 0.75, 0.73, 0.68, 0.8: one below 0.73 -> 1.5 / 4; at step 40 alone -> 0.5
    assert r["level_rank"] == pytest.approx(1.5 / 4)
    assert r["level_rank_same_step"] == pytest.approx(0.5)
    assert r["same_size_share"] == pytest.approx(0.25)
    assert second["refit"] is None  # onset 21: before refit 20's first touched step 22
    summary = re.dip_summary([first, second], events)
    assert summary["with_refit"] == 1 and summary["after_full_step"] == 0
    assert summary["after_full_step_by_chance"] == pytest.approx(0.5)


def test_a_verdict_without_the_arm_is_an_error():
    with pytest.raises(IncompleteRunsError, match="no arm cc"):
        re.dips({"results": {"cells": [{"compare": {}}]}}, "cc")


def test_cc_arms_pair_with_the_vanilla_arm_of_their_settings():
    nvfp4 = {"train": {"precision": "nvfp4"}}
    cal = {"loss": {"mode": "calibrated"}, "calibration": {"interval": 20}}
    arms = {
        "bf16": {"train": {"precision": "bf16"}},
        "fp8": {},
        "fp8-cc": dict(cal),
        "nv": nvfp4,
        "nv-cc": nvfp4 | cal,
        "nv-oracle": nvfp4 | {"loss": {"clip_source": "bf16"}},
    }
    assert re.cc_pairs(arms) == {"fp8-cc": "fp8", "nv-cc": "nv"}
    with pytest.raises(IncompleteRunsError, match="exactly one vanilla arm"):
        re.cc_pairs({"nv-cc": nvfp4 | cal, "fp8": {}})
    with pytest.raises(IncompleteRunsError, match="no arm with loss.mode calibrated"):
        re.cc_pairs({"fp8": {}})


def test_the_committed_refit_events_recompute_from_the_committed_runs():
    committed = json.loads((MATCHED / "refit-events.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(json_safe(re.compute(MATCHED / "runs"))))
    assert fresh == committed
    text = (MATCHED / "refit-events.md").read_text(encoding="utf-8")
    assert text == re.to_md(fresh) + "\n"
    # every refit of both pairs is there: 14 a run, 5 seeds, 2 pairs; 4 degradations
    assert len(committed["events"]) == 140 and committed["left_out"] == {}
    assert [(d["arm"], d["seed"], d["fired"]) for d in committed["dips"]] == [
        ("fp8-calibrated", 0, 294),
        ("fp8-calibrated", 1, 95),
        ("matched-calibrated", 0, 277),
        ("matched-calibrated", 4, 256),
    ]
