"""`fp8rl sweep`: statistics against hand computations, spec errors, and a 2-arm x 2-seed
sweep end to end (resume, --overwrite, the same metrics with --jobs 1 and 2, a failing run)."""

import json
import math
from pathlib import Path

import pytest
import yaml

from fp8rl.cli import main
from fp8rl.errors import ConfigError, Fp8rlError
from fp8rl.study.sweep import aggregate, load_runs, run_sweep
from fp8rl.study.sweep.aggregation import reward_final
from fp8rl.study.sweep.plots import band
from fp8rl.study.sweep.spec import load_spec, run_configs
from fp8rl.study.sweep.stats import paired, seed_mean, summarize_seeds, t_cdf, t_quantile
from helpers_config import sweep_spec

# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "df, t", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045), (10**6, 1.960)]
)
def test_t_quantile_matches_textbook_tables(df, t):
    assert t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-t, abs=5e-4)


@pytest.mark.parametrize("t", [-3.0, -0.4, 0.0, 0.7, 2.5, 40.0])
def test_t_cdf_matches_closed_forms(t):
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_summarize_seeds_by_hand():
    s = summarize_seeds([1.0, 2.0, 3.0, 4.0, 5.0])
    # sample variance 10/4 = 2.5; se = sqrt(2.5 / 5); t(0.975, 4) = 2.776
    assert s["mean"] == pytest.approx(3.0) and s["n"] == 5
    assert s["se"] == pytest.approx(math.sqrt(0.5))
    half = 2.776 * math.sqrt(0.5)
    assert s["ci95"] == pytest.approx([3 - half, 3 + half], abs=1e-3)
    # None and NaN seeds are left out of n but kept (as None) in per_seed
    s = summarize_seeds([0.2, None, float("nan"), 0.4])
    assert s["n"] == 2 and s["mean"] == pytest.approx(0.3) and s["se"] == pytest.approx(0.1)
    assert s["ci95"] == pytest.approx([0.3 - 1.2706, 0.3 + 1.2706], abs=1e-4)
    assert s["per_seed"] == [0.2, None, None, 0.4]
    one = summarize_seeds([0.7])
    assert one["mean"] == 0.7 and one["se"] is None and one["ci95"] is None and one["n"] == 1
    assert summarize_seeds([None])["mean"] is None


ROWS = [
    {"step": 0, "a": 100.0, "b": 0.0},
    {"step": 1, "a": 1.0, "b": 0.5},
    {"step": 2, "a": None, "b": 0.25},
    {"step": 3, "a": 3.0, "b": float("nan")},
    {"step": 4, "a": 4.0, "b": 1.0},
]


def test_seed_mean_skips_early_steps_and_missing_values():
    assert seed_mean(ROWS, "a", skip_steps=1) == pytest.approx((1 + 3 + 4) / 3)
    assert seed_mean(ROWS, "a", skip_steps=0) == pytest.approx((100 + 1 + 3 + 4) / 4)
    assert seed_mean(ROWS, "b", skip_steps=3) == pytest.approx(1.0)
    assert seed_mean(ROWS, "missing") is None
    assert reward_final([{"step": i, "rollout/reward": float(i)} for i in range(12)], 10) == 6.5


def test_paired_uses_rows_where_both_are_finite():
    other = [
        {"step": 0, "a": 9.0, "b": 0.0},
        {"step": 1, "a": 0.5, "b": 0.25},
        {"step": 2, "a": 0.75, "b": 0.25},
    ]
    p = paired({0: ROWS, 1: other}, "a", "b")
    # seed 0: steps 1 and 4 have both (0.5, 3.0); seed 1: steps 1 and 2 (0.25, 0.5)
    d0, d1 = (0.5 + 3.0) / 2, (0.25 + 0.5) / 2
    assert p["per_seed"] == pytest.approx([d0, d1]) and p["n"] == 2
    assert p["mean"] == pytest.approx((d0 + d1) / 2)
    assert p["se"] == pytest.approx(abs(d0 - d1) / 2)  # two values: sd = |d0-d1|/sqrt(2)
    assert paired([ROWS], "a", "b")["se"] is None


def test_band_is_mean_and_se_over_seeds_per_step():
    runs = [
        [{"step": 0, "x": 1.0}, {"step": 1, "x": 2.0}],
        [{"step": 0, "x": 3.0}, {"step": 1, "x": None}],
    ]
    steps, means, ses = band(runs, "x", skip_step0=False)
    assert steps == [0, 1] and means == [2.0, 2.0]
    assert ses[0] == pytest.approx(1.0) and math.isnan(ses[1])  # one seed at step 1: no band
    assert band(runs, "x", skip_step0=True)[0] == [1]


# ---------------------------------------------------------------- spec errors


def _write(tmp_path, spec, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda s: s["arms"]["fp8"].update(train={"bogus": 1}), "arms.fp8.train.bogus"),
        (
            lambda s: s["arms"]["bf16"]["rollout"].update(precision="fp4"),
            "arms.bf16.rollout.precision",
        ),
        (lambda s: s["base"]["train"].update(lr=-1.0), "base.train.lr"),
        (lambda s: s["base"]["task"]["options"].update(digits=0), "base.task.options.digits"),
        (lambda s: s.update(seeds=[0, "one"]), "seeds[1]"),
        (lambda s: s.update(seeds=[0, 0]), "seeds"),
        (lambda s: s.update(arms={}), "arms"),
        (lambda s: s.update(arms={"bad name": {}}), "arms.bad name"),
        (lambda s: s.update(repeats=3), "repeats"),
        (lambda s: s.update(skip_steps=-1), "skip_steps"),
    ],
)
def test_bad_spec_is_one_line_exit_2_and_creates_nothing(tmp_path, capsys, change, needle):
    spec = sweep_spec(tmp_path)
    change(spec)
    out = tmp_path / "out"
    assert main(["sweep", str(_write(tmp_path, spec)), "--out", str(out), "--no-progress"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("fp8rl sweep: error:") and needle in err[0], err
    assert not out.exists()


def test_example_spec_validates(tmp_path):
    spec = load_spec(Path(__file__).parents[1] / "configs" / "sweep.yaml")
    configs = run_configs(spec, tmp_path / "out")
    assert len(configs) == len(spec.arms) * len(spec.seeds) == 9
    cfg = configs["fp8-calibrated", 2]
    assert (cfg.loss.mode, cfg.train.seed, cfg.name) == ("calibrated", 2, "fp8-calibrated")
    assert cfg.log.out_dir == str(tmp_path / "out" / "fp8-calibrated" / "seed-2")
    assert configs["bf16", 0].rollout.precision == "bf16" and not (tmp_path / "out").exists()


def test_the_gspo_spec_is_the_demo_s_setting_with_gspo_arms(tmp_path):
    from fp8rl.study.demo import load_demo_spec

    root = Path(__file__).parents[1] / "configs"
    gspo = run_configs(load_spec(root / "gspo.yaml"), tmp_path / "o")
    demo_spec = load_demo_spec(root / "demo.yaml")
    demo_spec.pop("quick")
    demo = run_configs(load_spec(demo_spec), tmp_path / "o")
    assert {a for a, _ in gspo} == {
        "bf16-gspo",
        "fp8-gspo",
        "fp8-gspo-calibrated",
        "fp8-gspo-calibrated-wide",
        "fp8-grpo",
    }
    modes = {a: (c.loss.mode, c.loss.resolved_eps(), c.shadow_passes) for (a, _), c in gspo.items()}
    assert modes["fp8-gspo-calibrated"] == ("gspo_calibrated", (3e-4, 4e-4), True)
    assert modes["fp8-gspo-calibrated-wide"] == modes["fp8-gspo-calibrated"]
    caps = {
        a: (c.calibration.max_step_lower, c.calibration.max_step_upper)
        for (a, _), c in gspo.items()
    }
    assert caps["fp8-gspo-calibrated-wide"] == (0.5, 1.0) == tuple(10 * x for x in caps["fp8-gspo"])
    assert modes["fp8-gspo"] == ("gspo", (3e-4, 4e-4), True)
    assert modes["bf16-gspo"] == ("gspo", (3e-4, 4e-4), False)
    # the GRPO arm is the demo's vanilla FP8 arm: the same run, up to its name and folder
    ours, theirs = gspo["fp8-grpo", 1].to_dict(), demo["fp8", 1].to_dict()
    for d in (ours, theirs):
        d.pop("name"), d["log"].pop("out_dir")
    assert ours == theirs


def test_missing_or_malformed_spec_file(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["sweep", str(tmp_path / "nope.yaml"), "--out", out]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    bad = _write(tmp_path, "base: {train: [1,\narms: x", "bad.yaml")
    assert main(["sweep", str(bad), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.yaml" in err[0] and "valid YAML" in err[0]
    with pytest.raises(ConfigError, match="--jobs"):
        run_sweep(sweep_spec(tmp_path), out, jobs=0)
    for threads in (0, 1.5, True):
        with pytest.raises(ConfigError, match="--threads"):
            run_sweep(sweep_spec(tmp_path), out, threads=threads)
    assert not (tmp_path / "out").exists()


def test_default_jobs_are_the_usable_cores(monkeypatch):
    from fp8rl.study.sweep import runner

    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert runner.usable_cores() == 3


# ---------------------------------------------------------------- end to end


def _series(out, arm, seed, key):
    lines = (out / arm / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(ln) for ln in lines]
    return [r.get(key) for r in rows]


def _mtimes(out):
    return {p: p.stat().st_mtime_ns for p in out.glob("*/seed-*/done.json")}


def test_sweep_end_to_end_failure_resume_overwrite_and_determinism(tmp_path, weights, capsys):
    # Worker start-up (torch + transformers imports) dominates on the CPU, so one sweep
    # folder carries every end-to-end check: 3 pools in all.
    spec = sweep_spec(tmp_path, weights)
    out = tmp_path / "out"
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    # first arm: passes validation, fails to load; each worker then runs good arms after it
    with_broken = {**spec, "arms": {"broken": {"model": {"source": str(empty)}}, **spec["arms"]}}
    stale = out / "bf16" / "seed-1"  # an unfinished earlier attempt: nothing of it may survive
    (stale / "checkpoints" / "step_00000009").mkdir(parents=True)
    (stale / "events.log").write_text("step 7: from an earlier attempt\n")
    (stale / "worker.log").write_text("killed\n")  # the sweep's own: deleted, not moved aside
    assert (
        main(
            [
                "sweep",
                str(_write(tmp_path, with_broken, "broken.yaml")),
                "--out",
                str(out),
                "--no-progress",
                "--jobs",
                "2",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run broken seed 0 failed" in err[0], err
    assert "broken/seed-0/worker.log" in err[0] and "1 more failed" in err[0]
    assert "Traceback" in (out / "broken" / "seed-0" / "worker.log").read_text()
    assert not (out / "broken" / "seed-0" / "done.json").exists()
    assert not (out / "aggregate.json").exists()
    with pytest.raises(Fp8rlError, match="not complete"):
        aggregate(with_broken, out)
    assert not (stale / "checkpoints").exists() and not list(stale.glob(".old-*"))
    events = stale / "events.log"
    assert "earlier attempt" not in (events.read_text() if events.exists() else "")

    # the good arms all finished; the 2-arm spec finds them complete and aggregates
    spec_path = _write(tmp_path, spec)
    argv = ["sweep", str(spec_path), "--out", str(out), "--no-progress"]
    before = _mtimes(out)
    assert len(before) == 4
    assert main(argv) == 0
    assert _mtimes(out) == before  # reran nothing
    printed = capsys.readouterr().out
    assert "| bf16 | 2 |" in printed and "| fp8 | 2 |" in printed and " ± " in printed
    runs = [(a, s) for a in ("bf16", "fp8") for s in (0, 1)]
    for arm, seed in runs:
        done = json.loads((out / arm / f"seed-{seed}" / "done.json").read_text())
        assert (done["arm"], done["seed"], done["steps"]) == (arm, seed, 3) and done["wall_s"] > 0
        assert 0.0 <= done["eval_final"]["eval/mean@1"] <= 1.0
        cfg = json.loads((out / arm / f"seed-{seed}" / "config.json").read_text())
        assert cfg["train"]["seed"] == seed and cfg["name"] == arm
    agg = json.loads((out / "aggregate.json").read_text())
    assert agg["skip_steps"] == 1 and agg["final_window"] == 10
    fp8 = agg["arms"]["fp8"]
    assert fp8["seeds"] == [0, 1]
    # recompute from the raw rows: per seed mean over steps 1 and 2, then mean and SE
    per_seed = [sum(_series(out, "fp8", s, "rollout/entropy")[1:]) / 2 for s in (0, 1)]
    ent = fp8["metrics"]["rollout/entropy"]
    assert ent["per_seed"] == pytest.approx(per_seed) and ent["n"] == 2
    assert ent["mean"] == pytest.approx(sum(per_seed) / 2)
    assert ent["se"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2)
    half = 12.706 * ent["se"]  # t(0.975, df=1)
    assert ent["ci95"] == pytest.approx(
        [ent["mean"] - half, ent["mean"] + half], abs=1e-3 * ent["se"] + 1e-12
    )
    rewards = [sum(_series(out, "fp8", s, "rollout/reward")) / 3 for s in (0, 1)]
    assert fp8["final"]["reward_final"]["per_seed"] == pytest.approx(rewards)
    assert set(fp8["final"]) >= {"reward_final", "eval_final_mean@1", "wall_s"}
    assert fp8["wall_s_total"] == pytest.approx(sum(fp8["final"]["wall_s"]["per_seed"]))
    assert "shadow/lower_clipfrac_neg_fp8" in fp8["metrics"]
    assert "shadow/lower_clipfrac_neg_fp8" not in agg["arms"]["bf16"]["metrics"]
    assert list(fp8["paired"]) == ["shadow/lower_clipfrac_neg_fp8 - shadow/lower_clipfrac_neg_bf16"]
    assert "NaN" not in (out / "aggregate.json").read_text()
    assert aggregate(spec_path, out) == agg  # callable on its own on the finished folders
    for png in ("reward.png", "entropy.png", "shadow_lower_clip.png", "bounds.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert not (out / "shadow_lower_clip_excess.png").exists() or any(
        "shadow/lower_clip_excess" in a["metrics"] for a in agg["arms"].values()
    )
    first = {
        (a, s): (_series(out, a, s, "rollout/reward"), _series(out, a, s, "actor/loss"))
        for a, s in runs
    }
    assert any(v != 0 for r, _ in first.values() for v in r), "warm start gave no reward"

    # --overwrite reruns everything, here in one worker: the same metrics as with two
    assert main(argv + ["--overwrite", "--jobs", "1"]) == 0
    assert all(before[p] != t for p, t in _mtimes(out).items())
    for a, s in runs:
        again = (_series(out, a, s, "rollout/reward"), _series(out, a, s, "actor/loss"))
        assert again == first[a, s], (a, s)
    capsys.readouterr()

    # a complete run made from another config is not mixed in silently
    changed = sweep_spec(tmp_path, weights)
    changed["base"]["train"]["lr"] = 2e-3
    assert main(["sweep", str(_write(tmp_path, changed, "changed.yaml")), "--out", str(out)]) == 2
    assert "train.lr" in capsys.readouterr().err
    rows = load_runs(spec_path, out)["fp8"][1]
    assert [r["rollout/reward"] for r in rows] == _series(out, "fp8", 1, "rollout/reward")


def test_the_gspo_modes_run_in_fp8rl_train_and_fp8rl_sweep(tmp_path, weights, capsys):
    # fp8rl train: 2 steps of gspo_calibrated from the warm start, shadow passes every step
    base = sweep_spec(tmp_path, weights)["base"]
    base["train"]["steps"] = 2
    run = tmp_path / "train-run"
    config = _write(tmp_path, {**base, "loss": {"mode": "gspo_calibrated"}}, "gspo.yaml")
    argv = ["train", "--config", str(config), "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["calib/lower"] == pytest.approx(1 - 3e-4)
    assert "calib/next_lower" in rows[1] and "calib/alpha" not in rows[0]  # refits from step 1
    assert all("shadow/seq_lower_clip_excess" in r for r in rows)
    assert any(r["rollout/reward"] > 0 for r in rows), "warm start gave no reward"
    capsys.readouterr()

    # fp8rl sweep: vanilla GSPO with diagnostics and calibrated GSPO, one seed, one worker
    spec = {
        "base": base,
        "arms": {
            "fp8-gspo": {"loss": {"mode": "gspo"}, "calibration": {"diagnostics": True}},
            "fp8-gspo-calibrated": {"loss": {"mode": "gspo_calibrated"}},
        },
        "seeds": [0],
    }
    out = tmp_path / "sweep"
    argv = ["sweep", str(_write(tmp_path, spec)), "--out", str(out), "--no-progress", "--jobs", "1"]
    assert main(argv) == 0
    agg = json.loads((out / "aggregate.json").read_text())
    pair = "shadow/seq_lower_clipfrac_neg_fp8 - shadow/seq_lower_clipfrac_neg_bf16"
    for arm in spec["arms"]:
        a = agg["arms"][arm]
        assert pair in a["paired"] and "shadow/seq_logratio_err_sd" in a["metrics"]
        # the paired excess is the mean over steps >= 1 of the logged per-step excess
        excess = _series(out, arm, 0, "shadow/seq_lower_clip_excess")[1:]
        assert a["paired"][pair]["mean"] == pytest.approx(sum(excess) / len(excess))
    bounds = _series(out, "fp8-gspo", 0, "calib/lower")
    assert bounds == [pytest.approx(1 - 3e-4)] * 2  # vanilla: the bounds never move
