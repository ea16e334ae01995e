"""config/yaml_strict.py: YAML as written. A duplicated key, a base-60 number and a leading-zero
octal are one-line errors naming the line; merge keys, and numbers that read as written,
load as usual."""

import pytest

from fp8rl.config import load_config
from fp8rl.config.yaml_strict import load_yaml
from helpers_config import refused_yaml

# YAML files: (text, needles the one-line error must hold)
YAML_ERRORS = {
    # PyYAML keeps the last of two equal keys without a word
    "duplicate_key": ("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", ["duplicate key 'lr'", "line 3"]),
    "duplicate_section": (
        "train: {steps: 3}\nrollout: {n: 2}\ntrain: {lr: 0.1}\n",
        ["duplicate key 'train'", "line 3", "first on line 1"],
    ),
    # YAML 1.1: 1:30 is the base-60 number 90, 010 the octal 8
    "sexagesimal_int": ("train:\n  steps: 1:30\n", ["'1:30'", "line 2", "base-60", "(90)"]),
    "sexagesimal_float": ("train:\n  lr: 0:0.5\n", ["'0:0.5'", "base-60"]),
    "octal_seed": ("train:\n  seed: 010\n", ["'010'", "line 2", "octal", "(8)"]),
}


@pytest.mark.parametrize("case", list(YAML_ERRORS))
def test_yaml_that_does_not_mean_what_it_shows_is_a_one_line_error(tmp_path, case):
    text, needles = YAML_ERRORS[case]
    message = refused_yaml(tmp_path, text)
    for needle in needles:
        assert needle in message, (needle, message)


def test_merge_keys_and_a_key_overriding_a_merged_one_are_no_duplicates():
    text = "base: &b {n: 2, top_p: 0.5}\nrollout:\n  <<: *b\n  n: 4\n"
    assert load_yaml(text)["rollout"] == {"n": 4, "top_p": 0.5}


def test_yaml_numbers_that_read_as_written_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    # 1e-3 without a dot is a string to PyYAML: a float key still reads it as the number
    path.write_text("train: {lr: 1e-3, steps: 1_000, seed: 0}\nlog: {progress: no}\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.steps, cfg.train.seed) == (0.001, 1000, 0)
    assert cfg.log.progress is False
