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
    from fp8rl.config import config_from_dict
    from fp8rl.tasks import get_task
    from fp8rl.train.checkpoint import save_weights
    from fp8rl.train.model_setup import build_model
    from fp8rl.train.sft import warm_start
    from helpers_config import tiny_config

    path = tmp_path_factory.mktemp("ws") / "ws.safetensors"
    cfg = config_from_dict(tiny_config(path.parent))
    task = get_task(cfg.task.name, **cfg.task.options)
    torch.manual_seed(0)
    model, tok = build_model(cfg.model, task, torch.device("cpu"))
    warm_start(model, tok, task.sft_examples("train"), steps=40, batch_size=32, lr=5e-3)
    save_weights(model, path)
    return path
