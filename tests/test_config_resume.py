"""config/resume.py: what `--resume` may change, a resumed run's config against its
checkpoint's."""

import json

from fp8rl.config import RESUME_MAY_CHANGE, config_from_dict, resume_differences
from helpers_config import tiny_config


def test_resume_keys_list():
    data = tiny_config("x")
    a = json.loads(json.dumps(config_from_dict(data).to_dict()))
    b = json.loads(json.dumps(a))
    b["train"]["steps"] += 5
    b["log"]["keep_last"] = 7
    b["name"] = "other"
    b["model"]["device"] = "cpu"
    assert resume_differences(a, b) == []
    b["model"]["tiny"]["hidden_size"] = 64
    b["calibration"]["interval"] = 9
    b["train"]["micro_batch_size"] = 2
    assert [k for k, *_ in resume_differences(a, b)] == [
        "calibration.interval",
        "model.tiny",
        "train.micro_batch_size",
    ]
    assert "train.steps" in RESUME_MAY_CHANGE and "log" in RESUME_MAY_CHANGE
