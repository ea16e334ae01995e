"""Checkpoints: safetensors round trip of weights, optimizer and RNG; atomic; pruned."""

import json
import random

import numpy as np
import pytest
import torch

from fp8rl.errors import CheckpointError
from fp8rl.models import tiny_qwen3
from fp8rl.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from helpers_runs import trained_model


def test_round_trip_weights_optimizer_rng(tmp_path):
    model, opt = trained_model()
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(7)
    path = save_checkpoint(tmp_path, 3, model, opt, {"calibration": {"lower": 0.7}})
    expect = (torch.rand(3), np.random.rand(2), random.random())

    model2, opt2 = trained_model(seed=1)
    state = load_checkpoint(path, model2, opt2)
    assert state["step"] == 3 and state["calibration"] == {"lower": 0.7}
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for i in s1:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(s1[i][name]), torch.as_tensor(s2[i][name]))
    got = (torch.rand(3), np.random.rand(2), random.random())
    assert (
        torch.equal(expect[0], got[0]) and np.array_equal(expect[1], got[1]) and expect[2] == got[2]
    )
    # safetensors and JSON only: nothing pickled
    assert sorted(p.name for p in path.iterdir()) == [
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
        "state.json",
    ]
    json.loads((path / "state.json").read_text())


def test_pruning_and_incomplete_checkpoints_are_ignored(tmp_path):
    model, opt = trained_model()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, opt, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    # a crash mid-write leaves a folder without state.json: never picked up
    broken = tmp_path / "checkpoints" / "step_00000009"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint(broken, model)


def test_mismatched_model_is_a_clear_error(tmp_path):
    model, opt = trained_model()
    path = save_checkpoint(tmp_path, 1, model, opt, {})
    other = tiny_qwen3(num_hidden_layers=2)
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(path, other)
