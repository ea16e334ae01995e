"""Evaluation arithmetic: pass@k, mean@k (avg@k), and scoring already generated responses."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .base import Sample, Task
from .scoring import score_batch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    The chance that k samples drawn without replacement from the n include a correct one.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"pass_at_k: {name} must be an integer, got {value!r}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # Exact integers, one rounding at the division.
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _matrix(scores, name: str) -> np.ndarray:
    try:
        m = np.asarray(scores, dtype=float)
    except ValueError as e:
        raise ValueError(f"{name}: rows must all have the same number of samples") from e
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(
            f"{name}: expected a non-empty (prompts, samples) matrix, got shape {m.shape}"
        )
    return m


def mean_at_k(scores) -> float:
    """mean@k (avg@k): the mean score over k samples per prompt, averaged over prompts.

    `scores` is a (prompts, k) matrix; rows must have equal length so every prompt weighs
    the same.
    """
    return float(_matrix(scores, "mean_at_k").mean())


def _default_ks(n: int) -> list[int]:
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted(set(ks + [n]))


def score_responses(
    task: Task,
    samples: Sequence[Sample],
    responses_per_sample: Sequence[Sequence[str]],
    ks: Sequence[int] | None = None,
) -> dict:
    """Score n responses per sample: {"mean@n", "pass@k" for each k, "parsed_frac", counts}.

    A response counts as correct for pass@k when its reward info says "correct". ks
    defaults to the powers of two up to n, and n.
    """
    if len(samples) != len(responses_per_sample):
        raise ValueError(
            f"score_responses: {len(responses_per_sample)} response lists "
            f"for {len(samples)} samples"
        )
    if not samples:
        raise ValueError("score_responses: no samples")
    n = len(responses_per_sample[0])
    for i, rs in enumerate(responses_per_sample):
        if len(rs) != n or n == 0:
            raise ValueError(
                f"score_responses: sample {i} has {len(rs)} responses, "
                f"expected {n} (>= 1) like sample 0"
            )
    ks = _default_ks(n) if ks is None else list(ks)
    flat_samples = [s for s in samples for _ in range(n)]
    flat_responses = [r for rs in responses_per_sample for r in rs]
    scored = score_batch(task, flat_responses, flat_samples)
    results = scored.results
    scores = np.array(scored.scores, dtype=float).reshape(len(samples), n)
    correct = np.array([bool(r.info["correct"]) for r in results]).reshape(len(samples), n)
    out = {f"mean@{n}": mean_at_k(scores)}
    for k in ks:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)]))
    out["parsed_frac"] = float(np.mean(scored.parsed))
    out["num_prompts"] = len(samples)
    out["num_responses"] = len(results)
    return out
