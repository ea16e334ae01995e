"""study/learning.py on hand-made runs and evaluations: the issue-44 rule by hand arithmetic."""

from __future__ import annotations

import json
import math

import pytest

from fp8rl.study.learning import main, paired_accuracy


def write_run(folder, rewards, steps=None, resumed_at=None):
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": i, "rollout/reward": r, "rollout/entropy": 1.0 - 0.001 * i}
        for i, r in enumerate(rewards)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    total = len(rewards) if steps is None else steps
    (folder / "config.json").write_text(json.dumps({"train": {"steps": total}}))
    if resumed_at is not None:
        (folder / "events.log").write_text(f"step {resumed_at}: resumed from step_x\n")
    return folder


def write_eval(path, correct, k=4, **setting):
    base = {"split": "test", "k": k, "limit": None, "temperature": 1.0, "seed": 0}
    problems = [
        {"index": i, "question": f"q{i}", "answer": "1", "k": k, "correct": c}
        for i, c in enumerate(correct)
    ]
    path.write_text(json.dumps({**base, **setting, "problems": problems}))
    return path


def judge(tmp_path, rewards, before, after, capsys, **run):
    run_dir = write_run(tmp_path / "run", rewards, **run)
    b = write_eval(tmp_path / "before.json", before)
    a = write_eval(tmp_path / "after.json", after)
    code = main([str(run_dir), "--before", str(b), "--after", str(a), "--out", str(tmp_path / "o")])
    return code, capsys.readouterr()


def test_paired_interval_by_hand(tmp_path):
    # per-problem shares 1/4 2/4 0 1 -> 3/4 2/4 2/4 1: differences .5 0 .5 0
    b = json.loads(write_eval(tmp_path / "b.json", [1, 2, 0, 4]).read_text())
    a = json.loads(write_eval(tmp_path / "a.json", [3, 2, 2, 4]).read_text())
    got = paired_accuracy(b, a)
    se = math.sqrt((4 * 0.25**2) / 3) / 2  # sample sd of the differences over sqrt(4)
    assert got["before"] == pytest.approx(7 / 16) and got["after"] == pytest.approx(11 / 16)
    assert got["diff"] == pytest.approx(0.25) and got["se"] == pytest.approx(se)
    assert got["ci95"] == pytest.approx([0.25 - 1.96 * se, 0.25 + 1.96 * se])


def test_a_run_that_meets_both_thresholds_learns(tmp_path, capsys):
    rewards = [0.2] * 10 + [0.25] * 10 + [0.35] * 20  # last 20 - first 10 = +0.15
    # logged samples: two texts at steps 0 and 1, one text twice at 30 and 39, 15 in neither
    samples = [(0, "a"), (1, "b"), (30, "c"), (39, "c"), (15, "d")]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "samples.jsonl").write_text(
        "".join(json.dumps({"step": st, "response": t}) + "\n" for st, t in samples)
    )
    code, out = judge(tmp_path, rewards, [0, 1, 2, 1] * 5, [1, 2, 3, 2] * 5, capsys, resumed_at=17)
    assert code == 0
    assert "difference +0.150" in out.out and "verdict: learns" in out.out
    result = json.loads((tmp_path / "o" / "learning.json").read_text())
    assert result["verdict"]["learns"] is True and result["resumed_at"] == [17]
    assert result["accuracy"]["diff"] == pytest.approx(0.25)
    # not judged, reported: entropy 1 - 0.001 step over steps 0-9 and 20-39
    assert result["tracked"]["rollout/entropy"]["first"] == pytest.approx(1 - 0.0045)
    assert result["tracked"]["rollout/entropy"]["last"] == pytest.approx(1 - 0.0295)
    assert result["tracked"]["distinct_samples"] == {"first": 1.0, "last": 0.5}
    assert (tmp_path / "o" / "learning.png").read_bytes()[:4] == b"\x89PNG"
    assert "learning.png" in (tmp_path / "o" / "learning.md").read_text()


@pytest.mark.parametrize(
    "rewards, after, missed",
    [
        ([0.2] * 10 + [0.25] * 20, [1, 2, 3, 2] * 5, "reward gain +0.050"),
        ([0.2] * 10 + [0.4] * 20, [0, 1, 2, 2] * 5, "held-out +6.2 points"),
        # +25 points on average, but the interval reaches below 0
        ([0.2] * 10 + [0.4] * 20, [3, 2, 2, 4], "interval [-3.3"),
    ],
)
def test_each_missed_threshold_is_named(tmp_path, capsys, rewards, after, missed):
    before = [0, 1, 2, 1] * 5 if len(after) == 20 else [1, 2, 0, 4]
    code, out = judge(tmp_path, rewards, before, after, capsys)
    assert code == 0 and "verdict: does not learn" in out.out and missed in out.out


@pytest.mark.parametrize(
    "rewards, steps, reason",
    [
        ([0.2] * 25, None, "25 steps, fewer than 30"),
        ([0.2] * 40, 150, "the run stopped at step 40 of its 150"),
        ([0.2] * 12 + [float("nan")] + [0.3] * 20, None, "step 12 has no finite"),
    ],
)
def test_short_partial_or_nan_runs_give_no_verdict(tmp_path, capsys, rewards, steps, reason):
    code, out = judge(tmp_path, rewards, [0, 1], [2, 3], capsys, steps=steps)
    assert code == 0 and f"verdict: no verdict: {reason}" in out.out
    result = json.loads((tmp_path / "o" / "learning.json").read_text())
    assert result["verdict"]["learns"] is None


def one_error(capsys, code, needle):
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and needle in err, err


def test_bad_inputs_are_one_line_errors_before_anything_is_written(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", [0.2] * 30)
    b = write_eval(tmp_path / "b.json", [1, 2])
    out = ["--out", str(tmp_path / "o")]
    one_error(
        capsys,
        main([str(run_dir), "--before", str(tmp_path / "no.json"), "--after", str(b), *out]),
        "no such evaluation file",
    )
    (tmp_path / "bad.json").write_text("{")
    one_error(
        capsys,
        main([str(run_dir), "--before", str(tmp_path / "bad.json"), "--after", str(b), *out]),
        "not readable JSON",
    )
    write_eval(tmp_path / "over.json", [1, 5])
    one_error(
        capsys,
        main([str(run_dir), "--before", str(b), "--after", str(tmp_path / "over.json"), *out]),
        "0 <= correct <= k",
    )
    write_eval(tmp_path / "k8.json", [1, 2], k=8)
    one_error(
        capsys,
        main([str(run_dir), "--before", str(b), "--after", str(tmp_path / "k8.json"), *out]),
        "differ in 'k'",
    )
    write_eval(tmp_path / "three.json", [1, 2, 3])
    one_error(
        capsys,
        main([str(run_dir), "--before", str(b), "--after", str(tmp_path / "three.json"), *out]),
        "different problems",
    )
    one_error(
        capsys,
        main([str(tmp_path / "none"), "--before", str(b), "--after", str(b), *out]),
        "no metrics.jsonl",
    )
    assert not (tmp_path / "o").exists()
