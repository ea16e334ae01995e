"""config/sections.py: each section's own fields, checked by its `check()`: a value out of its
range or list is a ConfigError naming the dotted key and what is allowed; the loss's resolved
defaults per mode."""

import pytest

from fp8rl.config import config_from_dict, load_config
from fp8rl.errors import ConfigError
from helpers_config import assert_refused, tiny_config


def test_defaults_validate_and_overrides_apply():
    cfg = load_config(
        overrides=[
            "train.lr=1e-6",
            "loss.mode=dapo",
            "rollout.n=16",
            "model.tiny={hidden_size: 256}",
        ]
    )
    assert cfg.train.lr == 1e-6 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.n == 16
    assert cfg.model.tiny == {"hidden_size": 256}
    # dapo's defaults: clip-higher, token-mean, dynamic sampling
    assert cfg.loss.resolved_eps() == (0.2, 0.28)
    assert cfg.loss.resolved_agg() == "token-mean"
    assert cfg.loss.resolved_dynamic_sampling() is True
    grpo = load_config()
    assert (
        grpo.loss.resolved_eps() == (0.2, 0.2) and grpo.loss.resolved_agg() == "seq-mean-token-mean"
    )


# (override, the key the error names, what else it says); each value cannot run or cannot
# learn at all
BAD_VALUES = {
    "lr_negative": ("train.lr=-1", "train.lr", ["(0.0, 1.0]"]),
    "lr_0": ("train.lr=0", "train.lr", ["(0.0, 1.0]"]),
    "unknown_mode": ("loss.mode=ppo", "loss.mode", ["calibrated"]),
    "rollout_precision_fp4": ("rollout.precision=fp4", "rollout.precision", ["fp8-blockwise"]),
    "unknown_precision": ("rollout.precision=fp8", "rollout.precision", ["fp8-rowwise"]),
    "train_precision_int8": ("train.precision=int8", "train.precision", ["fp8-rowwise"]),
    "n_0": ("rollout.n=0", "rollout.n", ["[1, 1024]"]),
    "top_p_over_1": ("rollout.top_p=1.5", "rollout.top_p", ["(0.0, 1.0]"]),
    "top_p_0": ("rollout.top_p=0", "rollout.top_p", ["(0.0, 1.0]"]),
    "temperature_0": ("rollout.temperature=0", "rollout.temperature", ["(0.0, 10.0]"]),
    "eps_low_over_1": ("loss.eps_low=1.5", "loss.eps_low", ["(0.0, 1.0)"]),
    "tis_level_batch": ("loss.tis_level=batch", "loss.tis_level", ["sequence"]),
    "tis_cap_under_1": ("loss.tis_cap=0.5", "loss.tis_cap", ["[1.0"]),
    "interval_0": ("calibration.interval=0", "calibration.interval", ["[1,"]),
    "keep_last_0": ("log.keep_last=0", "log.keep_last", ["[1, 1000]"]),
    "one_beta": ("train.betas=[0.9]", "train.betas", ["two numbers"]),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_name_key_and_allowed_range(case):
    assert_refused(*BAD_VALUES[case])


def test_fold_with_more_than_one_mini_batch_is_one_config_error(tmp_path):
    data = tiny_config(tmp_path, train={"mini_batches": 2, "fold_old_log_probs": True})
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    message = str(e.value)
    assert "train.fold_old_log_probs" in message and "mini_batches is 2" in message
    assert "\n" not in message
