"""config/validate.py: the rules that read two sections (the ablations' settings, a batch
too small for its mini-batches), values that validate one by one but make the run do nothing,
and the optional packages an option needs (checked as a run starts, so that a config for
another machine still loads): each a one-line ConfigError naming the key, before any run
folder."""

from __future__ import annotations

import importlib.util
import json

import pytest

from fp8rl.cli import main
from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from helpers_config import assert_refused, tiny_config
from helpers_runs import one_error_line

SHADOW = {"diagnostics": True, "shadow_every": 1, "interval": 1, "min_tokens": 2}

# (override, the key the error names, what else it says)
BAD_VALUES = {
    "mini_batches_over_batch": ("train.mini_batches=100000", "train.mini_batches", ["batch size"]),
    "mini_batches_over_rows": ("train.mini_batches=257", "train.mini_batches", ["256"]),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_more_mini_batches_than_rows_names_the_key(case):
    assert_refused(*BAD_VALUES[case])


@pytest.mark.parametrize(
    "sections,key",
    [
        ({"loss": {"clip_source": "bf16"}, "calibration": {}}, "loss.clip_source"),
        (
            {
                "loss": {"clip_source": "bf16"},
                "calibration": {**SHADOW, "shadow_every": 2, "interval": 2},
            },
            "loss.clip_source",
        ),
        ({"loss": {"clip_source": "bf16", "mode": "cispo"}}, "loss.clip_source"),
        ({"loss": {"clip_source": "bf16", "dual_clip": 3.0}}, "loss.dual_clip"),
        ({"loss": {"clip_source": "fp16"}}, "loss.clip_source"),
        ({"loss": {"ratio_noise": {"sd": 0.1, "corr": 0.5}}}, "loss.ratio_noise"),  # an FP8 run
        (
            {"loss": {"ratio_noise": {"sd": 0.1}}, "train": {"precision": "bf16"}},
            "loss.ratio_noise",
        ),
        (
            {"loss": {"ratio_noise": {"sd": -1, "corr": 0}}, "train": {"precision": "bf16"}},
            "loss.ratio_noise.sd",
        ),
        (
            {"loss": {"ratio_noise": {"auto": "/nonexistent"}}, "train": {"precision": "bf16"}},
            "loss.ratio_noise.auto",
        ),
    ],
)
def test_bad_ablation_settings_name_the_key(tmp_path, sections, key):
    sections.setdefault("calibration", SHADOW)
    with pytest.raises(ConfigError) as e:
        config_from_dict(tiny_config(tmp_path, **sections))
    assert e.value.key == key


def _refused(tmp_path, capsys, key, *overrides):
    run = tmp_path / "run"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(tiny_config(run)))
    assert main(["train", "--config", str(cfg), "--no-progress", *overrides]) == 2
    line = one_error_line(capsys, f"config key '{key}'")
    assert not run.exists()
    return line


@pytest.mark.parametrize(
    "extra,key,value",
    [
        ("tensorboard", "log.tensorboard", "true"),
        ("wandb", "log.wandb", "{project: p, mode: offline}"),
    ],
)
def test_an_option_whose_extra_is_missing_is_refused_before_the_run_folder(
    tmp_path, capsys, monkeypatch, extra, key, value
):
    """Was: an ImportError after the run folder was made."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == extra else real(n, *a)
    )
    line = _refused(tmp_path, capsys, key, f"{key}={value}")
    assert f"pip install fp8rl[{extra}]" in line


@pytest.mark.parametrize(
    "override,key",
    [
        ("loss.overlong_factor=.inf", "loss.overlong_factor"),  # was: every update skipped, exit 0
        ("loss.overlong_factor=.nan", "loss.overlong_factor"),
        ("log.eval_every=1", "log.eval_every"),  # with log.eval_size=0: was the whole split
    ],
)
def test_a_value_that_makes_the_run_do_nothing_is_refused(tmp_path, capsys, override, key):
    _refused(tmp_path, capsys, key, override, "log.eval_size=0")
