"""The `fp8rl` command: complete --help, one-line errors, report files, eval and diagnose."""

import json
import subprocess
import sys

import pytest

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config, tiny_config_file
from helpers_step import parity_reward

COMMANDS = {
    "train": ["--config", "--resume", "--overwrite", "--out", "key=value"],
    "sweep": ["SPEC.yaml", "--out", "--jobs", "--overwrite", "--no-progress"],
    "demo": ["--quick", "--out", "--config"],
    "report": ["RUN_DIR", "--out"],
    "diagnose": ["--config", "--checkpoint", "--steps"],
    "eval": ["--config", "--checkpoint", "--split", "--k"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_lists_every_option(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in COMMANDS[command]:
        assert word in out, (command, word)


def test_user_errors_are_one_line_without_traceback(tmp_path):
    cases = [
        (["train", "train.lr=-3"], "train.lr"),
        (["train", "--config", str(tmp_path / "nope.yaml")], "nope.yaml"),
        (["report", str(tmp_path)], "no metrics.jsonl"),
        (["eval", "--checkpoint", str(tmp_path / "missing")], "--checkpoint"),
    ]
    for argv, needle in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "fp8rl", *argv], capture_output=True, text=True, cwd=tmp_path
        )
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert needle in lines[0] and lines[0].startswith(f"fp8rl {argv[0]}: error:")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = []
    for name, extra in (
        ("vanilla", {"calibration": {"interval": 1, "diagnostics": True, "min_tokens": 2}}),
        ("calib", {"loss": {"mode": "calibrated"}}),
    ):
        data = tiny_config(root / name, **extra)
        data["log"]["checkpoint_every"] = 2
        parity_reward(Trainer(config_from_dict(data))).fit()
        dirs.append(root / name)
    return root, dirs


def test_report_writes_plots_table_and_json(two_runs, capsys):
    root, dirs = two_runs
    out = root / "report"
    assert main(["report", *map(str, dirs), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| vanilla |" in table and "| calib |" in table
    pngs = {p.name for p in out.glob("*.png")}
    assert {
        "reward.png",
        "entropy.png",
        "clipfrac_lower_neg.png",
        "bounds.png",
        "nmae.png",
        "amplification.png",
        "shadow_lower_clip.png",
    } <= pngs
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    summary = json.loads((out / "report.json").read_text())
    assert summary["vanilla"]["steps"] == 2 and summary["calib"]["shadow_nmae_prob_mean"] > 0
    assert "![reward](reward.png)" in (out / "report.md").read_text()


def test_eval_and_diagnose_on_a_checkpoint(two_runs, tmp_path, capsys, monkeypatch):
    root, dirs = two_runs
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "scratch")))
    monkeypatch.setenv("FP8RL_SCRATCH", str(tmp_path / "scratch"))
    assert main(["eval", "--config", str(cfg), "--checkpoint", str(dirs[0]), "--limit", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["eval/mean@1"] <= 1.0 and result["eval/parsed_frac"] >= 0
    ckpt = dirs[0] / "checkpoints"
    before = {p.name: p.stat().st_mtime for p in ckpt.rglob("*")}
    assert main(["diagnose", "--config", str(cfg), "--checkpoint", str(dirs[0])]) == 0
    diag = json.loads(capsys.readouterr().out)
    for key in (
        "shadow/nmae_prob",
        "shadow/nmae_ratio",
        "shadow/amplification",
        "shadow/lower_clipfrac_neg_fp8",
        "shadow/lower_clipfrac_neg_bf16",
        "mismatch/kl_rollout_train",
    ):
        assert key in diag, key
    assert diag["shadow/nmae_prob"] > 0
    assert {p.name: p.stat().st_mtime for p in ckpt.rglob("*")} == before  # nothing written


def test_resume_runs_to_the_steps_the_run_was_started_with(tmp_path, capsys):
    """`fp8rl train --config C train.steps=2`, killed, then `--resume` without the override:
    the run ends at its own 2 steps, not the config file's 4; `train.steps=3` extends it."""
    import shutil

    run = tmp_path / "run"
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(
        json.dumps(
            tiny_config(run, train={"steps": 4}, log={"checkpoint_every": 1, "eval_size": 0})
        )
    )

    def rows():
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]

    assert main(["train", "--config", str(cfg_path), "--no-progress", "train.steps=2"]) == 0
    shutil.rmtree(run / "checkpoints" / "step_00000002")  # as a kill after step 1's row leaves it
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--no-progress", "--resume"]) == 0
    assert rows() == [0, 1]
    assert "its own train.steps = 2, not the config's 4" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 2
    cmd = ["train", "--config", str(cfg_path), "--no-progress", "--resume", "train.steps=3"]
    assert main(cmd) == 0
    assert rows() == [0, 1, 2]
    capsys.readouterr()


def test_eval_out_writes_each_problems_correct_count(tmp_path, capsys, monkeypatch):
    import fp8rl.train.evaluate as evaluate
    from fp8rl.tasks.scoring import BatchScores

    def first_problem_right(task, texts, samples):
        # every sample of the split's first problem correct, none of the others
        scores = [float(s.question == target) for s in samples]
        return BatchScores(scores=scores, parsed=[True] * len(texts), results=[], malformed=[])

    cfg = tiny_config_file(tmp_path)
    target = Trainer(config_from_dict(json.loads(cfg.read_text()))).task.samples("test")[0].question
    monkeypatch.setattr(evaluate, "score_batch", first_problem_right)
    out = tmp_path / "eval.json"
    argv = ["eval", "--config", str(cfg), "--k", "3", "--limit", "5", "--out", str(out)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    data = json.loads(out.read_text())
    assert data["summary"] == printed and printed["eval/mean@3"] == pytest.approx(3 / 15)
    assert (data["k"], data["limit"], data["temperature"]) == (3, 5, 1.0)
    assert [p["index"] for p in data["problems"]] == [0, 1, 2, 3, 4]
    assert [p["correct"] for p in data["problems"]] == [3, 0, 0, 0, 0]
    assert data["problems"][0]["question"] == target and data["problems"][0]["k"] == 3


def test_eval_out_in_a_missing_folder_is_one_line_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "missing" / "eval.json"
    assert main(["eval", "--config", str(tiny_config_file(tmp_path)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out" in err and "existing folder" in err
    assert not (tmp_path / "run").exists()
