"""config/files.py: the files a config names; here the FP8 run that
`loss.ratio_noise: {auto: RUN_DIR}` reads its noise S and C from."""

from __future__ import annotations

import json

import pytest

from fp8rl.config.files import read_noise_calibration
from fp8rl.errors import ConfigError
from fp8rl.rl.shadow import CORR_KEY, SD_KEY
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
