"""Scoring a batch of responses with one `task.rewards` call, so that a task's batch path
(MathTask's grading processes with `workers` > 0) serves training and evaluation alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .base import RewardResult, Sample, Task


class BatchScores(NamedTuple):
    scores: list[float]  # RewardResult.score of each response
    parsed: list[bool]  # info["parsed"]; True where a task does not say
    results: list[RewardResult]
    # info["malformed"] (the response breaks the task's format); `not parsed` where a task
    # defines nothing finer, so every task gets a garble rate. Last, so that unpacking the
    # first three fields keeps working.
    malformed: list[bool]


def score_batch(task: Task, texts: Sequence[str], samples: Sequence[Sample]) -> BatchScores:
    """Score texts[i] against samples[i], in order."""
    results = task.rewards(texts, samples)
    if len(results) != len(texts):  # a short list would shift every later reward
        raise ValueError(
            f"{type(task).__name__}.rewards: {len(results)} results for {len(texts)} responses"
        )
    parsed = [bool(r.info.get("parsed", True)) for r in results]
    return BatchScores(
        scores=[float(r.score) for r in results],
        parsed=parsed,
        results=list(results),
        malformed=[
            bool(r.info.get("malformed", not p)) for r, p in zip(results, parsed, strict=True)
        ],
    )
