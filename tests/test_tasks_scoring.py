"""score_batch: one task.rewards call per batch, same rewards in the same order as scoring
each response alone; MathTask's worker processes grade a batch exactly as inline grading."""

import json
import random

import pytest
import torch

from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.tasks import FIXTURE_PATH, ArithmeticTask, MathTask, RewardResult, Sample, score_batch
from fp8rl.train.evaluate import evaluate_policy


class CountingTask(ArithmeticTask):
    """Arithmetic prompts; a reward that varies with the text, and counted calls."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batch_calls = []

    def reward(self, response_text, sample):
        correct = len(response_text) % 2 == 0
        info = {"parsed": any(c.isdigit() for c in response_text), "correct": correct}
        return RewardResult(1.0 if correct else 0.0, info)

    def rewards(self, responses, samples):
        self.batch_calls.append(len(responses))
        return super().rewards(responses, samples)


def test_one_batch_call_same_rewards_in_order():
    task = CountingTask(train_size=20, test_size=5)
    samples = task.samples("train")[:4]
    texts = ["12<eos>", "7", "", "abc1", "99", "x"]
    paired = [samples[i % 4] for i in range(len(texts))]
    got = score_batch(task, texts, paired)
    assert task.batch_calls == [len(texts)]
    alone = [task.reward(t, s) for t, s in zip(texts, paired, strict=True)]
    assert got.scores == [r.score for r in alone] == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert got.parsed == [r.info["parsed"] for r in alone]
    assert got.results == alone


def test_parsed_defaults_to_true_and_short_results_raise():
    class Bare(ArithmeticTask):
        def reward(self, response_text, sample):
            return RewardResult(0.5)

    class Short(ArithmeticTask):
        def rewards(self, responses, samples):
            return super().rewards(responses, samples)[:-1]

    s = Sample(prompt="1+1=", answer="2")
    bare = score_batch(Bare(train_size=4, test_size=2), ["a", "b"], [s, s])
    assert bare.parsed == [True, True] and bare.malformed == [False, False]
    with pytest.raises(ValueError, match="1 results for 2 responses"):
        score_batch(Short(train_size=4, test_size=2), ["a", "b"], [s, s])


def test_math_workers_grade_a_batch_as_inline_and_as_labelled():
    rows = [
        json.loads(x) for x in FIXTURE_PATH.read_text(encoding="utf-8").splitlines() if x.strip()
    ]
    cases = [
        (
            r["text"],
            Sample(prompt=row["problem"], answer=row["answer"]),
            float(r.get("scorer_label", r["label"])),
        )
        for row in rows
        for r in row["responses"]
    ]
    random.Random(0).shuffle(cases)  # neighbours from different problems: order matters
    texts, samples, labels = zip(*cases, strict=True)
    inline, pooled = MathTask(), MathTask(workers=2)
    try:
        a = score_batch(inline, texts, samples)
        b = score_batch(pooled, texts, samples)
        assert pooled._pool._started == 2  # the batch really went to the processes
    finally:
        pooled.close()
    assert a.scores == b.scores == list(labels)
    assert a.parsed == b.parsed
    assert [r.info for r in a.results] == [r.info for r in b.results]


def test_evaluate_policy_scores_each_chunk_in_one_call():
    task = CountingTask(train_size=20, test_size=6)
    model = tiny_qwen3(vocab_size=task.vocab_size)
    engine = RolloutEngine(model, task.tokenizer)
    out = evaluate_policy(model, engine, task, limit=6, max_new_tokens=5, k=3, batch_prompts=4)
    assert task.batch_calls == [12, 6]  # chunks of 4 and 2 prompts, 3 samples each
    # Reference: the same generations, each response scored on its own.
    gen = torch.Generator().manual_seed(0)
    samples = task.samples("test")
    correct, parsed = [], []
    for chunk in (samples[:4], samples[4:6]):
        batch = engine.generate(
            [s.prompt for s in chunk],
            SamplingParams(n=3, temperature=1.0, max_new_tokens=5),
            generator=gen,
        )
        for text, i in zip(batch.texts, batch.prompt_index.tolist(), strict=True):
            r = task.reward(text, chunk[i])
            correct.append(r.score >= 1.0)
            parsed.append(r.info["parsed"])
    rows = [correct[i : i + 3] for i in range(0, 18, 3)]
    assert out["eval/mean@3"] == pytest.approx(sum(correct) / 18)
    assert out["eval/pass@3"] == pytest.approx(sum(any(r) for r in rows) / 6)
    assert out["eval/parsed_frac"] == pytest.approx(sum(parsed) / 18)
    assert 0 < sum(correct) < 18  # the check above can tell right from wrong


def test_malformed_defaults_to_not_parsed_and_a_task_may_say_more():
    class Finer(ArithmeticTask):
        def reward(self, response_text, sample):
            info = {"parsed": response_text != "x", "correct": False}
            if response_text == "loop":
                info["malformed"] = True  # parsed, yet the task calls it garbled
            if response_text == "y":
                info["malformed"] = False  # not parsed, yet well-formed to the task
            return RewardResult(0.0, info)

    s = Sample(prompt="1+1=", answer="2")
    got = score_batch(Finer(train_size=4, test_size=2), ["1", "x", "loop", "y"], [s] * 4)
    assert got.parsed == [True, False, True, True]
    assert got.malformed == [False, True, True, False]
    # arithmetic defines nothing finer: "x" (not an integer) is malformed, "3" is not
    plain = score_batch(ArithmeticTask(train_size=4, test_size=2), ["3<eos>", "x<eos>"], [s, s])
    assert plain.malformed == [False, True]
