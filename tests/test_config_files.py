"""config/files.py: the files a config names. Paths expand `~` and environment variables and
stay relative to the cwd; an empty path, one with trailing spaces or an unset variable is a
one-line error naming the key; a model folder must exist; the FP8 run that
`loss.ratio_noise: {auto: RUN_DIR}` reads its noise S and C from."""

from __future__ import annotations

import json

import pytest

from fp8rl.config import load_config
from fp8rl.config.files import read_noise_calibration
from fp8rl.errors import ConfigError
from fp8rl.rl.shadow import CORR_KEY, SD_KEY
from helpers_config import assert_refused, refused_yaml
from helpers_rl import estimated_noise, synthetic_shadow


def write_metrics(run_dir, rows, extra_lines=()):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_read_noise_calibration_means_steps_from_one(tmp_path):
    rows = [
        {"step": 0, SD_KEY: 9.0, CORR_KEY: 0.0},  # left out: step 0
        {"step": 1, SD_KEY: 0.02, CORR_KEY: 0.4, "actor/pg_loss": 0.1},
        {"step": 2, SD_KEY: None, CORR_KEY: None},  # NaN written as null: skipped
        {"step": 3, SD_KEY: 0.04, CORR_KEY: 0.6},
        {"step": 4, "actor/pg_loss": 0.3},  # no shadow pass this step
    ]
    write_metrics(tmp_path / "run", rows, extra_lines=['{"step": 5, "shadow/logprob_err_sd": 0.'])
    s, c = read_noise_calibration(tmp_path / "run")
    assert s == pytest.approx(0.03) and c == pytest.approx(0.5)
    s0, c0 = read_noise_calibration(str(tmp_path / "run"), min_step=0)
    assert s0 == pytest.approx((9.0 + 0.06) / 3) and c0 == pytest.approx(1.0 / 3)


def test_read_noise_calibration_recovers_synthetic_s_and_c(tmp_path):
    rows = []
    for step in range(1, 6):
        out = estimated_noise(*synthetic_shadow(0.04, 0.7, n=20_000, seed=step))
        rows.append({"step": step, **{k: float(v) for k, v in out.items()}})
    write_metrics(tmp_path / "fp8run", rows)
    s, c = read_noise_calibration(tmp_path / "fp8run")
    assert s == pytest.approx(0.04, rel=0.10) and c == pytest.approx(0.7, rel=0.10)


def test_read_noise_calibration_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="metrics.jsonl") as e:
        read_noise_calibration(tmp_path / "nope")
    assert "\n" not in str(e.value) and e.value.key == "loss.ratio_noise.auto"
    write_metrics(
        tmp_path / "bf16",
        [{"step": 1, "actor/pg_loss": 0.1}, {"step": 0, SD_KEY: 0.1, CORR_KEY: 0.1}],
    )
    with pytest.raises(ConfigError, match=str(tmp_path / "bf16" / "metrics.jsonl")) as e:
        read_noise_calibration(tmp_path / "bf16")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# Paths: `~` and environment variables expand, relative paths stay relative to the cwd

# YAML files: (text, needles the one-line error must hold)
PATH_ERRORS = {
    "empty_out_dir": ("log: {out_dir: ''}\n", ["log.out_dir", "a non-empty path"]),
    "spaces_out_dir": ("log: {out_dir: 'runs/a '}\n", ["log.out_dir", "trailing spaces"]),
    "unset_variable": (
        "log: {out_dir: $FP8RL_TEST_UNSET/run}\n",
        ["log.out_dir", "environment variables are set ($FP8RL_TEST_UNSET)"],
    ),
    "empty_model_source": ("model: {source: ''}\n", ["model.source", "a non-empty path"]),
    "empty_train_path": (
        "task: {name: math, options: {train_path: ['a.jsonl', '']}}\n",
        ["task.options.train_path[1]", "a non-empty path"],
    ),
}


@pytest.mark.parametrize("case", list(PATH_ERRORS))
def test_yaml_that_does_not_mean_what_it_shows_is_a_one_line_error(tmp_path, monkeypatch, case):
    monkeypatch.delenv("FP8RL_TEST_UNSET", raising=False)
    text, needles = PATH_ERRORS[case]
    message = refused_yaml(tmp_path, text)
    for needle in needles:
        assert needle in message, (needle, message)


def test_a_model_folder_that_does_not_exist_names_the_key():
    assert_refused("model.source=/does/not/exist", "model.source", ["checkpoint folder"])


def test_home_and_environment_variables_in_paths_expand(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FP8RL_TEST_DATA", str(tmp_path / "data"))
    path = tmp_path / "c.yaml"
    path.write_text(
        "task:\n  name: math\n  options:\n"
        "    train_path:\n      - ~/a.jsonl\n      - ${FP8RL_TEST_DATA}/b.jsonl\n"
        "    test_path: $FP8RL_TEST_DATA/t.jsonl\n"
        "log: {out_dir: ~/runs/x}\n"
    )
    cfg = load_config(path)
    assert cfg.log.out_dir == str(tmp_path / "home" / "runs" / "x")
    assert cfg.task.options["train_path"] == [
        str(tmp_path / "home" / "a.jsonl"),
        str(tmp_path / "data" / "b.jsonl"),
    ]
    assert cfg.task.options["test_path"] == str(tmp_path / "data" / "t.jsonl")
    # the saved config holds the path used
    assert cfg.to_dict()["log"]["out_dir"] == cfg.log.out_dir
    # relative paths are the cwd's, as typed (not the config file's folder)
    assert load_config(path, ["log.out_dir=runs/y"]).log.out_dir == "runs/y"
