"""Shared pytest set-up. Keep it small: every test folder's owner reads this file."""

import pytest
import torch


@pytest.fixture
def torch_single_thread():
    """One intra-op thread for the test: small tensors on a shared, busy CPU run faster so
    (thread hand-offs cost more than they save). Opt in with
    `pytestmark = pytest.mark.usefixtures("torch_single_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
