"""Math rewards/s: one batch of responses graded inline (workers=0) and in grading processes.

The responses are built from the shipped fixture (src/fp8rl/data/math_fixture.jsonl): its own
labelled responses, plus boxed right and wrong answers after a stretch of reasoning, and
responses with no answer at all. Not a test:

    python bench/rewards.py                  # 1024 responses, workers 0 and 2
    python bench/rewards.py --smoke          # 64 responses, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.tasks import FIXTURE_PATH, MathTask, Sample, score_batch

REASONING = (
    "First collect the terms, then simplify each side and check the result against the "
    "original equation; the arithmetic is routine once the setup is right. "
)


def responses(n: int, seed: int = 0) -> tuple[list[str], list[Sample]]:
    rows = [
        json.loads(x) for x in FIXTURE_PATH.read_text(encoding="utf-8").splitlines() if x.strip()
    ]
    rng = random.Random(seed)
    texts, samples = [], []
    for i in range(n):
        row = rows[i % len(rows)]
        sample = Sample(prompt=row["problem"], answer=row["answer"], question=row["problem"])
        reasoning = REASONING * rng.randint(1, 6)
        kind = rng.random()
        if kind < 0.4:  # the fixture's own responses: boxed, phrased, odd forms
            text = rng.choice(row["responses"])["text"]
        elif kind < 0.65:
            text = reasoning + f"So the answer is \\boxed{{{row['answer']}}}."
        elif kind < 0.9:
            text = reasoning + f"So the answer is \\boxed{{{row['answer']} + {rng.randint(1, 9)}}}."
        else:  # cut off before stating an answer
            text = reasoning
        texts.append(text)
        samples.append(sample)
    return texts, samples


def measure(task: MathTask, batches) -> tuple[float, float, list[list[float]]]:
    """(first batch s, median of the other batches s, scores of each batch). The first batch
    includes starting the grading processes; every batch holds new texts (seeds differ), so
    sympy's caches do not replay an earlier batch."""
    times, scores = [], []
    for texts, samples in batches:
        t0 = time.perf_counter()
        scores.append(score_batch(task, texts, samples).scores)
        times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[1:]), scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="64 responses, one repeat")
    ap.add_argument("--responses", type=int, default=1024)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = 64 if args.smoke else args.responses
    repeats = 1 if args.smoke else args.repeats
    batches = [responses(n, seed) for seed in range(1 + repeats)]
    print(
        f"{n} responses a batch over {len({s.answer for s in batches[0][1]})} problems; "
        f"{os.cpu_count()} CPUs; median of {repeats} batches after a first one"
    )

    header = (
        f"{'workers':>7} | {'first batch':>11} | {'steady batch':>12} | {'rewards/s':>9} | "
        f"{'vs inline':>9}"
    )
    print(header)
    print("-" * len(header))
    reference, base = None, None
    for w in args.workers:
        task = MathTask(workers=w)
        try:
            # Inline grading and worker start-up both import math-verify and sympy: do it once
            # here for the main process so the inline row is not charged for it.
            score_batch(task, ["\\boxed{1}"], [Sample(prompt="", answer="1")])
            first, steady, scores = measure(task, batches)
        finally:
            task.close()
        if reference is None:
            reference = scores
        assert scores == reference, f"workers={w} graded differently from workers={args.workers[0]}"
        rate = n / steady
        base = rate if base is None else base
        print(f"{w:>7} | {first:>10.2f}s | {steady:>11.2f}s | {rate:>9.0f} | {rate / base:>8.2f}x")
    right = sum(s == 1.0 for s in reference[0])
    print(
        f"first batch: {right} of {n} responses scored 1.0; every batch graded the same under "
        "every worker count"
    )


if __name__ == "__main__":
    main()
