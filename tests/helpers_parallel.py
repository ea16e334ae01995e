"""Tests of several processes (data parallel): a free port, the model they run, and how
closely two runs' metrics rows must agree.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import socket
from contextlib import contextmanager

# The data-parallel tests' model: smaller than TINY, since each test runs it in 3 processes.
TINY_DP = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def leaving_together():
    """Run a rank's body, then leave its process group with the other ranks. Gloo aborts a
    process (SIGABRT, no Python error) whose group is torn down by interpreter exit, or that
    leaves while another rank still works: CI saw it on a rank that skipped both."""
    import torch.distributed as dist

    try:
        yield
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# Integer counts, reduced as sums of integers: equal to the last bit.
EXACT = {
    "calib/n_neg",
    "calib/n_pos",
    "calib/k",
    "calib/pool_steps",
    "calib/pool_neg_tokens",
    "calib/updated",
    "train/updates",
    "train/skipped_updates",
    "train/skipped_updates_total",
    "train/shadow_step",
}
# Everything else is a mean (or a weighted sum) of per-token or per-row float32 values of
# order 1, and the per-token values differ by float32 rounding only: the two runs push other
# batch shapes through the kernels (a rank's 12 rows against 24, other micro-batches) and add
# the gradients up in another order. Measured over train.seed 0-7, calibrated and dapo: every
# log-prob within 1.5e-6, every metric within 4.8e-7 of the reference. ATOL keeps an 8x margin
# for machines whose kernels round differently, and scales with the metric's size
# (grad_norm, entropy are a few units). Relative tolerance would be wrong here: actor/loss
# and actor/pg_loss are sums of terms of both signs that cancel to ~1e-3, and their 7e-8 of
# rounding is 1.5e-4 of that. A wrong weight moves a metric by a share of the rows or tokens
# (test_unequal_token_counts_per_rank_...: 1e-2 and more), four orders above ATOL.
ATOL = 4e-6


def compare_rows(got, want):
    """Two runs' metrics rows agree step by step: EXACT keys to the last bit, the rest within
    ATOL (scaled by the metric's size); the same keys in both, `time/*` aside."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith("time/")}
        assert keys == {k for k in g if not k.startswith("time/")}
        for k in sorted(keys):
            if w[k] is None or isinstance(w[k], str) or k in EXACT:
                assert g[k] == w[k], (g["step"], k, g[k], w[k])
            else:
                tol = ATOL * max(1.0, abs(w[k]))
                assert abs(g[k] - w[k]) <= tol, (g["step"], k, g[k], w[k])
