"""scripts/behaviour_check.py's compare: any differing value, a setting missing on one side or
cut short, and a comparison of nothing each fail it (hand-built records, no training)."""

import json

import pytest

from helpers_scripts import load_script


@pytest.fixture(scope="module")
def check():
    return load_script("behaviour_check")


def _compare(check, tmp_path, a: dict, b: dict) -> int:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return check.compare(str(pa), str(pb))


ROWS = {"grpo": [{"step": 0, "actor/loss": 0.5}, {"step": 1, "actor/loss": 0.25}]}


def test_equal_records_pass(check, tmp_path, capsys):
    assert _compare(check, tmp_path, ROWS, json.loads(json.dumps(ROWS))) == 0
    assert "0 of 4 values differ" in capsys.readouterr().out


def test_one_bit_of_one_value_fails(check, tmp_path, capsys):
    other = {"grpo": [ROWS["grpo"][0], {"step": 1, "actor/loss": 0.25000000000000006}]}
    assert _compare(check, tmp_path, ROWS, other) == 1
    assert "grpo step 1 actor/loss" in capsys.readouterr().out


@pytest.mark.parametrize(
    "other",
    [{}, {"grpo": ROWS["grpo"][:1]}, {**ROWS, "gspo": []}, {"grpo": [{"step": 0}, {"step": 1}]}],
    ids=["setting-missing", "cut-short", "extra-setting", "metric-missing"],
)
def test_a_missing_or_shorter_record_fails(check, tmp_path, other):
    assert _compare(check, tmp_path, ROWS, other) == 1


def test_comparing_nothing_fails(check, tmp_path, capsys):
    assert _compare(check, tmp_path, {}, {}) == 1
    assert "nothing was compared" in capsys.readouterr().out


def test_every_setting_validates(check, tmp_path):
    from fp8rl.config import config_from_dict

    for name, sections in check.SETTINGS.items():
        config_from_dict(check.merged(tmp_path / name, sections))
