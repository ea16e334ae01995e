"""The real-model study's report (study/real_report.py, docs/study-real.md "The
measurements") on a constructed judged sweep, checked by hand: the verdict with 3 seeds,
held-out gains and gaps, the channel's early and late windows, the garble kinds, and the
input checks that refuse to conclude."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fp8rl.study.real_report import main, report, report_text
from fp8rl.study.sweep.spec import SPEC_FILE, load_spec, run_dir
from fp8rl.study.sweep.stats import t_quantile
from fp8rl.utils import json_safe
from helpers_evals import write_eval

SEEDS = [0, 1, 2]
STEPS = 50
ARMS = {
    "fp32": {"rollout": {"precision": "fp32"}, "train": {"precision": "fp32"}},
    "fp8": {},
    "fp8-calibrated": {"loss": {"mode": "calibrated"}},
}
BEFORE = [2, 2, 3, 1]  # correct of 8, per held-out problem
# after training, per arm and seed: fp32 and calibrated alike, vanilla 1 of 8 lower on
# every problem of seed 1 only
AFTER = {("fp32", s): [6, 6, 7, 5] for s in SEEDS} | {
    ("fp8-calibrated", s): [6, 6, 7, 5] for s in SEEDS
}
AFTER |= {("fp8", 0): [6, 6, 7, 5], ("fp8", 1): [5, 5, 6, 4], ("fp8", 2): [6, 6, 7, 5]}


def _rows(arm: str, seed: int) -> list[dict]:
    """fp32 and calibrated learn to 0.8; vanilla's reward falls to 0.3 from step 18 on every
    seed (its 10-step mean is 0.13 below its best of 0.68 from step 22 on: the reward-drop
    criterion fires at step 41); shadow rows every 5 steps."""
    rows = []
    for s in range(STEPS):
        drop = arm == "fp8" and s >= 18
        row = {
            "step": s,
            "rollout/reward": 0.2 if s < 10 else (0.3 if drop else 0.8),
            "rollout/entropy": 1.0,
            "rollout/malformed_frac": 0.125 if s < 10 else 0.0,
            "rollout/malformed_frac/no_number": 0.125 if s < 10 else 0.0,
            "rollout/malformed_frac/repeat": 0.0625 if s < 10 else 0.0,
            "rollout/response_len": 30.0,
            "time/cpu_step": 36.0,  # 50 steps: half a CPU-hour a run
        }
        if s % 5 == 0 and arm != "fp32":
            late = s >= 20  # the report's late window starts at 50: none of these steps
            row |= {
                "shadow/nmae_prob": 0.06,
                "shadow/nmae_quotient": 2.0,
                "shadow/clipfrac_fp8": 0.04,
                "shadow/clipfrac_bf16": 0.01,
                "shadow/clipfrac_lower_neg_fp8": 0.03,
                "shadow/clipfrac_lower_neg_bf16": 0.0,
                "shadow/lower_clip_excess": 0.03,
                "shadow/high_entropy_lower_clip_share": 0.4 if late else 0.2 + 0.1 * seed,
            }
        rows.append(row)
    return rows


def _responses(seed: int) -> list[dict]:
    """At steps 5 and 10: two negative responses, the high-entropy one lower-clipped."""
    return [
        {
            "step": step,
            "entropy": e,
            "length": n,
            "adv": -1.0,
            "lower_clip_fp8": clipped,
            "lower_clip_bf16": False,
        }
        for step in (0, 5, 10)
        for e, n, clipped in ((2.0 + seed, 40, True), (1.0, 20, False))
    ]


def _study(tmp_path):
    spec = load_spec(
        {
            "base": {"train": {"steps": STEPS}},
            "arms": ARMS,
            "seeds": SEEDS,
            "final_window": 20,
        }
    )
    out = tmp_path / "runs"
    out.mkdir()
    (out / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        folder.mkdir(parents=True)
        lines = "".join(json.dumps(r) + "\n" for r in _rows(arm, seed))
        (folder / "metrics.jsonl").write_text(lines)
        lines = "".join(json.dumps(r) + "\n" for r in _responses(seed))
        (folder / "responses.jsonl").write_text(lines)
        (folder / "config.json").write_text(json.dumps({"loss": {"clip_source": "fp8"}}))
        (folder / "done.json").write_text(json.dumps({"wall_s": 1.0, "resumed_at": None}))
        write_eval(tmp_path / "evals" / arm / f"seed-{seed}.json", AFTER[arm, seed])
    write_eval(tmp_path / "before.json", BEFORE)
    return [
        str(out),
        "--evals",
        str(tmp_path / "evals"),
        "--before",
        str(tmp_path / "before.json"),
        "--dest",
        str(tmp_path / "report"),
    ]


def test_the_report_by_hand(tmp_path, capsys):
    assert main(_study(tmp_path)) == 0
    r = json.loads((tmp_path / "report" / "report.json").read_text())
    # vanilla degrades on all 3 seeds (reward drop), fp32 on none: it goes wrong; calibrated
    # equals fp32 on every seed: on track, and 0.5 above vanilla over the last 20 steps
    v = r["verdict"]
    assert (v["verdict"], v["ref_degraded"]) == ("a", 0)
    assert v["arms"]["fp8"]["degraded"] == 3 and v["arms"]["fp8"]["goes_wrong"]
    assert v["arms"]["fp8-calibrated"]["on_track"]
    assert v["cc_minus_vanilla"]["mean"] == pytest.approx(0.5)

    assert r["cpu_hours"] == {arm: [0.5] * 3 for arm in ARMS}
    assert (
        "by seed: fp32 0.50, 0.50, 0.50; fp8 0.50"
        in (tmp_path / "report" / "report.md").read_text()
    )

    h = r["held_out"]
    assert h["before"] == pytest.approx(8 / 32)
    assert h["arms"]["fp32"]["gain"]["mean"] == pytest.approx(16 / 32)  # +4 of 8 each
    gap = h["arms"]["fp8"]["gap"]  # -1/8 on seed 1, 0 on the others
    assert gap["mean"] == pytest.approx(-1 / 24)
    sd = statistics.stdev([0, -1 / 8, 0])
    half = t_quantile(0.975, 2) * sd / 3**0.5
    assert gap["ci95"] == pytest.approx([-1 / 24 - half, -1 / 24 + half])

    # shadow steps 5..45 are all early (< 50): 0.2 + 0.1 seed on 5-15, 0.4 on 20-45
    ch = r["channel"]
    early = [(3 * (0.2 + 0.1 * s) + 6 * 0.4) / 9 for s in SEEDS]
    assert ch["arms"]["fp8"]["early"]["mean"] == pytest.approx(statistics.mean(early))
    assert ch["arms"]["fp8"]["late"]["n"] == 0 and ch["reproduced"] is False
    assert "fp32" not in r["signatures"] and r["signatures"]["fp8"]["stats"]["S3"]["mean"] == 4

    # at every shadow step from 5: the share over seeds, the garble rate, responses pooled
    steps = r["channel_by_step"]["fp8"]
    assert [e["step"] for e in steps] == list(range(5, STEPS, 5)) and "fp32" not in r[
        "channel_by_step"
    ]
    five, ten, fifteen = steps[:3]
    assert five["shadow/high_entropy_lower_clip_share"]["mean"] == pytest.approx(0.3)
    assert steps[-1]["shadow/high_entropy_lower_clip_share"]["per_seed"] == [0.4] * 3
    assert five["shadow/lower_clipfrac_neg_bf16"]["mean"] is None  # not logged here
    assert (five["rollout/malformed_frac"]["mean"], ten["rollout/malformed_frac"]["mean"]) == (
        0.125,
        0.0,
    )
    assert five["responses"] == {
        "n_clipped": 3,
        "n_unclipped": 3,
        "entropy_clipped": pytest.approx(3.0),
        "entropy_unclipped": 1.0,
        "length_clipped": 40.0,
        "length_unclipped": 20.0,
    }
    assert (
        fifteen["responses"]["n_clipped"] == 0 and fifteen["responses"]["entropy_clipped"] is None
    )

    g = r["garble"]["fp8"]
    assert set(g) == {"all", "no_number", "repeat"}
    assert g["repeat"]["first"]["mean"] == 0.0625 and g["repeat"]["last"]["mean"] == 0.0
    # by clip decision, steps >= 1: the clipped response has entropy 2 + seed, length 40
    b = r["by_clip"]["fp8"]
    assert b["entropy_clipped"]["mean"] == pytest.approx(3.0) and b["length_clipped"]["mean"] == 40
    assert b["clipped_share"]["mean"] == 0.5

    text = (tmp_path / "report" / "report.md").read_text()
    assert "**Verdict (a)**" in text and "## The channel: it stays shut" in text
    assert "Arms on fp32's track: fp8-calibrated." in text
    # mean@8 after: 0.75, 0.625, 0.75; gains over 0.25: +50, +37.5, +50 points
    assert "| fp8 | 0.708 ± 0.042 | +45.8 [" in text
    assert capsys.readouterr().out == text
    assert "| 5 | 6.0 % | 0.30 (n=3) | - | - | 0.125 | 3.00 / 1.00 | 40.0 / 20.0 | 3 / 3 |" in text
    for plot in ("trajectories", "channel_by_step"):
        assert (tmp_path / "report" / f"{plot}.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: (t / "evals" / "fp8" / "seed-2.json").unlink(), "no held-out evaluation"),
        (lambda t: (t / "runs" / "fp8" / "seed-1" / "done.json").unlink(), "seed-1"),
    ],
)
def test_missing_input_is_one_line_and_nothing_is_written(tmp_path, capsys, damage, message):
    argv = _study(tmp_path)
    damage(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "report").exists()


REPO = Path(__file__).resolve().parents[1]
COMMITTED = ("docs/study-real/runs", "docs/study-real/evals")
BEFORE_EVAL = "docs/real-model/learn-run/eval-before.json"


def test_the_committed_report_recomputes_from_the_committed_runs(monkeypatch):
    """docs/study-real/report/report.{json,md} from the committed judged runs and evaluations,
    and every table the doc quotes, line for line."""
    monkeypatch.chdir(REPO)  # the report names its inputs relative to the repository
    dest = Path("docs/study-real/report")
    r, _ = report(*COMMITTED, BEFORE_EVAL)
    assert json.loads(json.dumps(json_safe(r))) == json.loads(
        (dest / "report.json").read_text(encoding="utf-8")
    )
    plots = [dest / f"{p}.png" for p in ("trajectories", "response_entropy", "channel_by_step")]
    text = report_text(r, plots)
    assert (dest / "report.md").read_text(encoding="utf-8") == text
    assert all(p.stat().st_size > 0 for p in plots)
    doc = (REPO / "docs" / "study-real.md").read_text(encoding="utf-8").splitlines()
    # every table but the per-step ones (### sections), which stay in the report
    quoted = [
        line
        for part in text.split("\n## ")
        for line in part.split("\n### ")[0].splitlines()
        if line.startswith("|")
    ]
    assert len(quoted) > 25 and [line for line in quoted if line not in doc] == []
    # the verdict the doc states is the report's, by its rule
    verdict = text.split("\n\n")[1].splitlines()[0]
    assert verdict.startswith("**Verdict (") and verdict in "\n".join(doc)
