"""Shared pytest set-up. Keep it small: every test folder's owner reads this file."""

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
