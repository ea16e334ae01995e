"""Shared pytest set-up. Keep it small: every test folder's owner reads this file."""

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """The whole suite runs torch on one intra-op thread: its models are tiny, and on a
    2-core machine a second OpenMP thread spinning at barriers costs far more than it
    brings (measured 15-30x slower forwards when the other core was busy). Subprocesses
    the tests start (CLI, distributed ranks) choose their own."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="session")
def _warm_start_cache(tmp_path_factory):
    """Warm starts (model.warm_start: auto) are cached under FP8RL_CACHE: the suite's own
    folder, never the user's ~/.cache; subprocesses inherit it."""
    before = os.environ.get("FP8RL_CACHE")
    os.environ["FP8RL_CACHE"] = str(tmp_path_factory.mktemp("fp8rl-cache"))
    yield
    if before is None:
        os.environ.pop("FP8RL_CACHE", None)
    else:
        os.environ["FP8RL_CACHE"] = before


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The sweep tests' init weights (tests/test_sweep*.py), built once per module: a short
    supervised warm start, since a random model never answers, and with all rewards 0
    advantages, losses and clip fractions would all be 0 and compare trivially equal."""
    from helpers_config import tiny_config
    from helpers_runs import warm_started

    path = tmp_path_factory.mktemp("ws") / "ws.safetensors"
    torch.manual_seed(0)
    return warm_started(path, tiny_config(path.parent), steps=40, lr=5e-3)
