"""A RolloutBatch written out by hand.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import torch


def hand_batch(texts=True):
    """A 3-row RolloutBatch written out by hand."""
    from fp8rl.rollout import RolloutBatch

    # 3 rows: prompts [1 2], [3], [4 5]; responses [6 7], [8 pad], [9 10]
    return RolloutBatch(
        prompt_ids=torch.tensor([[1, 2], [0, 3], [4, 5]]),
        prompt_mask=torch.tensor([[1, 1], [0, 1], [1, 1]]).bool(),
        response_ids=torch.tensor([[6, 7], [8, 0], [9, 10]]),
        response_mask=torch.tensor([[1, 1], [1, 0], [1, 1]]).bool(),
        log_probs=torch.tensor([[-1.0, -2.0], [-3.0, 0.0], [-4.0, -5.0]]),
        entropy=torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, 5.0]]),
        truncated=torch.tensor([True, False, True]),
        response_lengths=torch.tensor([2, 1, 2]),
        prompt_index=torch.tensor([0, 0, 1]),
        texts=["a", "b", "c"] if texts else None,
    )
