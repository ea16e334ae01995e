"""The long study's verdict rule (study/long_verdict.py, docs/study-long.md "The verdict
rule"), its tables and plots, and the committed raw-run format (study/export_runs.py,
metrics.jsonl.gz read in place of metrics.jsonl): hand-built cases and constructed sweeps."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from fp8rl.errors import Fp8rlError
from fp8rl.study.export_runs import export_runs
from fp8rl.study.export_runs import main as export_main
from fp8rl.study.long_verdict import (
    NO_VERDICT_REF,
    TRACK_SEEDS,
    WRONG_SEEDS,
    judge_arm,
    main,
    seed_thresholds,
    verdict,
)
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.study.sweep.stats import summarize_seeds, t_quantile
from fp8rl.train.runlog import read_metrics

SEEDS = [0, 1, 2, 3, 4]
STEPS, W = 80, 20


def _gap(per_seed):
    return summarize_seeds(per_seed)


@pytest.mark.parametrize(
    ("d", "d_ref", "gaps", "wrong", "track"),
    [
        (0, 0, [0.01, -0.01, 0.0, 0.02, -0.02], False, True),  # centred on 0
        (3, 1, [0.01, -0.01, 0.0, 0.02, -0.02], True, False),  # 3 seeds degrade
        (3, 2, [0.01, -0.01, 0.0, 0.02, -0.02], False, False),  # ... but so do 2 ref seeds
        (0, 0, [-0.06, -0.07, -0.08, -0.06, -0.07], True, False),  # confidently below -0.05
        (0, 0, [-0.02, -0.03, -0.04, -0.02, -0.03], False, False),  # below 0, not by 0.05
        (2, 0, [0.01, -0.01, 0.0, 0.02, -0.02], False, False),  # 2 degraded: neither
        (1, 0, [0.0, 0.01, 0.02, 0.03, 0.04], False, True),  # ahead of bf16 counts as on track
    ],
)
def test_judge_arm_by_hand(d, d_ref, gaps, wrong, track):
    j = judge_arm(d, d_ref, _gap(gaps))
    assert (j["goes_wrong"], j["on_track"]) == (wrong, track)


def test_seed_counts_scale_with_the_seeds_and_give_the_written_ones_at_five():
    assert seed_thresholds(5) == (WRONG_SEEDS, TRACK_SEEDS, NO_VERDICT_REF) == (3, 1, 2)
    # docs/study-real.md's table: ceil(0.6 n), floor(0.2 n), ceil(0.4 n)
    assert [seed_thresholds(n) for n in (3, 4, 6, 7, 10)] == [
        (2, 0, 2),
        (3, 0, 2),
        (4, 1, 3),
        (5, 1, 3),
        (6, 2, 4),
    ]


@pytest.mark.parametrize(
    ("d", "d_ref", "wrong", "track"),
    [
        (2, 0, True, False),  # 2 of 3 degrade, the reference none
        (2, 1, False, False),  # ... but one reference seed degrades too
        (1, 0, False, False),  # one of 3: neither label
        (0, 0, False, True),
    ],
)
def test_judge_arm_with_three_seeds_by_hand(d, d_ref, wrong, track):
    j = judge_arm(d, d_ref, _gap([0.01, -0.01, 0.0]), seeds=3)
    assert (j["goes_wrong"], j["on_track"]) == (wrong, track)


def test_judge_arm_needs_an_interval_to_be_on_track():
    assert not judge_arm(0, 0, _gap([0.0]))["on_track"]  # one seed: no interval


def _arm(degraded: int, reward: list[float]) -> dict:
    judged = {str(s): {"degraded": i < degraded, "fired": {}} for i, s in enumerate(SEEDS)}
    return {
        "outcomes": {"reward_last": summarize_seeds(reward)},
        "paired": {"reward_last": summarize_seeds([r - 0.3 for r in reward])},
        "degradation": judged,
        "degraded_seeds": degraded,
    }


def _results(arms: dict, ref_degraded: int = 0) -> dict:
    ref = {str(s): {"degraded": i < ref_degraded, "fired": {}} for i, s in enumerate(SEEDS)}
    return {
        "ref": "bf16",
        "final_window": W,
        "cells": [{"ref": {"degradation": ref}, "compare": arms}],
    }


BF16_LIKE = [0.31, 0.29, 0.3, 0.32, 0.28]
LOW = [0.1, 0.12, 0.11, 0.09, 0.1]


def test_verdict_a_b_c_and_no_verdict():
    a = verdict(_results({"fp8": _arm(4, LOW), "fp8-calibrated": _arm(0, BF16_LIKE)}))
    assert a["verdict"] == "a" and a["helping"] == ["fp8-calibrated"]
    diff = [x - y for x, y in zip(BF16_LIKE, LOW, strict=True)]
    assert a["cc_minus_vanilla"]["mean"] == pytest.approx(sum(diff) / 5)
    arms = {"fp8": _arm(4, LOW), "fp8-calibrated": _arm(3, LOW), "fp8-oracle": _arm(0, BF16_LIKE)}
    b = verdict(_results(arms))
    assert b["verdict"] == "b" and b["helping"] == ["fp8-oracle"]
    c = verdict(_results({"fp8": _arm(0, BF16_LIKE), "fp8-calibrated": _arm(0, BF16_LIKE)}))
    assert c["verdict"] == "c" and not c["no_verdict"]
    none = verdict(_results({"fp8": _arm(4, LOW), "fp8-calibrated": _arm(0, BF16_LIKE)}, 2))
    assert none["verdict"] == "c" and none["no_verdict"] and "no verdict" in none["why"]


def test_verdict_refuses_a_grid_or_a_missing_arm():
    with pytest.raises(Fp8rlError, match="fp8-calibrated"):
        verdict(_results({"fp8": _arm(0, BF16_LIKE)}))
    two = _results({"fp8": _arm(0, LOW), "fp8-calibrated": _arm(0, LOW)})
    two["cells"] *= 2
    with pytest.raises(Fp8rlError, match="one cell"):
        verdict(two)


def _rows(reward: float, entropy, lower=None):
    rows = []
    for s in range(STEPS):
        r = {
            "step": s,
            "rollout/reward": 0.2 if s < 10 else reward,
            "rollout/entropy": entropy(s),
            "rollout/malformed_frac": 0.0,
            "rollout/response_len": 40.0,
        }
        if lower is not None:
            r["calib/lower"], r["calib/upper"] = lower(s), 1.2 + (0.8 - lower(s)) / 2
        rows.append(r)
    return rows


def _write_sweep(out):
    """bf16 and fp8-calibrated learn to 0.3 + 0.01 i on seed i; fp8's entropy triples from
    step 30 (band criterion and detector fire) and its reward stays at 0.2 on every seed;
    fp8-calibrated moves its lower bound from 0.8 to 0.6 at step 20."""
    spec = {"base": {}, "arms": {"bf16": {}, "fp8": {}, "fp8-calibrated": {}}}
    spec.update(seeds=SEEDS, final_window=W)
    spec = load_spec(spec)
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm in spec.arms:
        for i, seed in enumerate(SEEDS):
            good = 0.3 + 0.01 * i
            if arm == "fp8":
                rows = _rows(0.2, lambda s: 0.9 if s >= 30 else 0.3)
            elif arm == "fp8-calibrated":
                rows = _rows(good, lambda s: 0.3, lambda s: 0.8 if s < 20 else 0.6)
            else:
                rows = _rows(good, lambda s: 0.3)
            folder = run_dir(out, arm, seed)
            folder.mkdir(parents=True)
            (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
            (folder / "config.json").write_text(
                json.dumps({"name": arm, "train": {"steps": STEPS}})
            )
            done = {"eval_final": {"eval/mean@1": good}, "wall_s": 10.0 + i, "resumed_at": None}
            (folder / "done.json").write_text(json.dumps(done))


def test_a_constructed_sweep_reads_verdict_a_from_its_exported_raw_runs(tmp_path, capsys):
    src, dst = tmp_path / "sweep", tmp_path / "raw"
    _write_sweep(src)
    assert export_main([str(src), str(dst)]) == 0
    assert not (run_dir(dst, "fp8", 0) / "metrics.jsonl").exists()
    zipped = run_dir(dst, "fp8", 0) / "metrics.jsonl.gz"
    first = zipped.read_bytes()
    assert read_metrics(run_dir(dst, "fp8", 0)) == read_metrics(run_dir(src, "fp8", 0))
    export_runs(src, dst)
    assert zipped.read_bytes() == first  # no time stamp: the same bytes again
    again = tmp_path / "raw-again"  # an export of the export keeps every gzipped file
    export_runs(dst, again)
    assert (run_dir(again, "fp8", 0) / "metrics.jsonl.gz").read_bytes() == first
    assert main([str(dst)]) == 0
    text = capsys.readouterr().out
    data = json.loads((dst / "verdict.json").read_text())
    v = data["verdict"]
    assert v["verdict"] == "a" and v["arms"]["fp8"]["degraded"] == 5
    # fp8 - bf16 reward, last 20 steps, on seed i: 0.2 - (0.3 + 0.01 i)
    gap = v["arms"]["fp8"]["reward_gap"]
    assert gap["mean"] == pytest.approx(-0.12)
    half = t_quantile(0.975, 4) * gap["se"]
    assert gap["ci95"] == pytest.approx([-0.12 - half, -0.12 + half])
    assert v["cc_minus_vanilla"]["mean"] == pytest.approx(0.12)
    assert data["wall_s"]["bf16"]["mean"] == pytest.approx(12.0)
    b = data["bounds"]
    assert list(b) == ["fp8-calibrated"] and b["fp8-calibrated"]["lower_min"] == pytest.approx(0.6)
    assert b["fp8-calibrated"]["upper_max"] == pytest.approx(1.3)
    assert "**Verdict (a)**" in text and "| fp8 | " in text and "5/5 (entropy_surge" in text
    for name in ("trajectories.png", "trajectories_verdict.png", "bounds_long.png"):
        assert (dst / name).stat().st_size > 10_000


def test_export_refuses_an_unfinished_sweep_before_writing(tmp_path):
    src = tmp_path / "sweep"
    _write_sweep(src)
    (run_dir(src, "fp8", 3) / "done.json").unlink()
    with pytest.raises(Fp8rlError, match="seed-3"):
        export_runs(src, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()
    # a study commits its runs as they come: the finished ones only, and no verdict from them
    export_runs(src, tmp_path / "raw", finished_only=True)
    assert (run_dir(tmp_path / "raw", "fp8", 2) / "metrics.jsonl.gz").is_file()
    assert not run_dir(tmp_path / "raw", "fp8", 3).exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "raw")])


def test_read_metrics_prefers_the_plain_file_and_falls_back_to_gz(tmp_path):
    rows = [{"step": 0, "x": 1.0}, {"step": 1, "x": math.pi}]
    with gzip.open(tmp_path / "metrics.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n{cut")
    assert read_metrics(tmp_path, quiet=True) == rows  # the cut last line is skipped
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5}))
    assert read_metrics(tmp_path) == [{"step": 5}]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        # every metric row gone: once read as "fp8 does not go wrong"
        (lambda out: [f.write_text("") for f in out.glob("*/seed-*/metrics.jsonl")], "step 0"),
        (lambda out: _truncate(run_dir(out, "fp8", 2), 50), "no metrics row for step 50"),
        (lambda out: _nan_reward(run_dir(out, "fp8-calibrated", 4), 33), "step 33 has no finite"),
        (lambda out: (run_dir(out, "bf16", 1) / "done.json").unlink(), "not finished"),
    ],
)
def test_no_verdict_from_missing_short_or_nan_runs(tmp_path, capsys, damage, says):
    out = tmp_path / "sweep"
    _write_sweep(out)
    damage(out)
    with pytest.raises(SystemExit) as e:
        main([str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and "Traceback" not in err
    assert not (out / "verdict.json").exists() and not (out / "verdict.md").exists()


def test_no_verdict_from_too_few_seeds_or_steps(tmp_path, capsys):
    out = tmp_path / "one-seed"
    _write_sweep(out)
    spec = json.loads((out / SPEC_FILE).read_text())
    (out / SPEC_FILE).write_text(json.dumps({**spec, "seeds": [0, 1]}))
    with pytest.raises(SystemExit):
        main([str(out)])
    assert "2 seed(s); the verdict rule needs at least 3" in capsys.readouterr().err
    (out / SPEC_FILE).write_text(json.dumps({**spec, "final_window": STEPS}))
    with pytest.raises(SystemExit):
        main([str(out)])
    assert f"a run of {STEPS} steps" in capsys.readouterr().err


def test_two_pairs_of_one_sweep_are_written_side_by_side(tmp_path, capsys):
    out = tmp_path / "sweep"
    _write_sweep(out)
    assert main([str(out)]) == 0
    first = (out / "verdict.md").read_text()
    args = [str(out), "--vanilla", "fp8-calibrated", "--cc", "fp8", "--name", "verdict-swapped"]
    assert main(args) == 0
    assert (out / "verdict.md").read_text() == first  # not overwritten
    swapped = json.loads((out / "verdict-swapped.json").read_text())["verdict"]
    assert swapped["vanilla"] == "fp8-calibrated" and swapped["verdict"] == "c"
    assert (out / "trajectories_verdict-swapped.png").stat().st_size > 10_000


def _truncate(folder, keep: int):
    lines = (folder / "metrics.jsonl").read_text().splitlines()[:keep]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _nan_reward(folder, step: int):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rows[step]["rollout/reward"] = float("nan")
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
