"""Math rewards: every labelled response of the shipped fixture, threads, worker processes.

Fixture labels are the mathematically right verdicts under the documented extraction rules
(docs/tasks.md). Where math-verify disagrees, the response carries "scorer_label" (what
math-verify gives) and a "note" saying why; the test pins that behaviour so that a change
in math-verify shows up here instead of silently changing rewards.
"""

import json
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fp8rl.tasks import FIXTURE_PATH, MathTask, Sample
from fp8rl.tasks.grading import TIMED_OUT

ROWS = [
    json.loads(line)
    for line in FIXTURE_PATH.read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def expected_score(response) -> float:
    return float(response.get("scorer_label", response["label"]))


@pytest.fixture(scope="module")
def task():
    t = MathTask()
    yield t
    t.close()


def test_fixture_shape():
    assert 30 <= len(ROWS) <= 40
    for row in ROWS:
        labels = {r["label"] for r in row["responses"]}
        assert labels == {0, 1}, row["problem"]  # every row has right and wrong responses
        for r in row["responses"]:
            assert r["label"] in (0, 1)
            if "scorer_label" in r:
                assert r["scorer_label"] != r["label"] and r["note"], r["text"]
            else:
                assert "note" not in r, r["text"]


def test_fixture_documents_known_math_verify_disagreements():
    disagreements = [r for row in ROWS for r in row["responses"] if "scorer_label" in r]
    assert len(disagreements) == 5


@pytest.mark.parametrize("row", ROWS, ids=[f"row{i + 1}" for i in range(len(ROWS))])
def test_fixture_row_labels(task, row):
    sample = Sample(prompt=row["problem"], answer=row["answer"], question=row["problem"])
    responses = row["responses"]
    results = task.rewards([r["text"] for r in responses], [sample] * len(responses))
    for r, res in zip(responses, results, strict=True):
        assert res.score == expected_score(r), (r["text"], res.info)
        assert res.info["correct"] is (res.score == 1.0)
        if "parsed" in r:
            assert res.info["parsed"] is r["parsed"], r["text"]
        assert res.info["timeout"] is False


def test_unparsable_and_hostile_responses_score_zero(task):
    sample = Sample(prompt="p", answer="\\frac{3}{4}")
    texts = [
        "",
        "no answer at all",
        "\\boxed{\\frac{",
        "\\boxed{" * 50 + "1",
        "\\boxed{}}}}{{{",
        "Answer: %%%",
    ]
    results = task.rewards(texts, [sample] * len(texts))
    assert [r.score for r in results] == [0.0] * len(texts)
    assert results[0].info == {
        "parsed": False,
        "correct": False,
        "extracted": None,
        "gold_parsed": None,
        "timeout": False,
    }


def test_text_after_an_end_of_sequence_marker_is_ignored(task):
    sample = Sample(prompt="p", answer="34")
    texts = [
        "Answer: 34<|endoftext|><|endoftext|>",
        "\\boxed{34}<|im_end|>\\boxed{1}",
        "Answer: 34</s>Answer: 2",
    ]
    assert [r.score for r in task.rewards(texts, [sample] * 3)] == [1.0, 1.0, 1.0]


def test_runaway_sympy_work_times_out_in_the_main_thread():
    task = MathTask(timeout_s=1)
    result = task.reward("\\boxed{10^{10^{10}}}", Sample(prompt="p", answer="3"))
    assert result.score == 0.0 and result.info["timeout"] is True


def _pick(n):
    """n (response, sample, expected score) triples spread over the fixture."""
    picked = []
    for row in ROWS[::4]:
        sample = Sample(prompt=row["problem"], answer=row["answer"])
        for r in row["responses"][:2]:
            picked.append((r["text"], sample, expected_score(r)))
    return picked[:n]


@pytest.fixture(scope="module")
def pooled():
    """One task with two grading processes, shared to start as few processes as possible."""
    t = MathTask(timeout_s=1, workers=2)
    yield t
    t.close()


def test_reward_from_other_threads(pooled):
    """math-verify's SIGALRM timeouts raise outside the main thread; the task must not."""
    cases = _pick(8)
    with ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(lambda c: pooled.reward(c[0], c[1]), cases))
    assert [r.score for r in results] == [c[2] for c in cases]
    assert not any(r.info["timeout"] for r in results)
    # A batch from a plain thread, and math-verify's own timeout inside a worker.
    out = {}
    t = threading.Thread(
        target=lambda: out.setdefault(
            "r", pooled.rewards([c[0] for c in cases], [c[1] for c in cases])
        )
    )
    t.start()
    t.join()
    assert [r.score for r in out["r"]] == [c[2] for c in cases]
    with ThreadPoolExecutor(max_workers=1) as ex:
        bomb = ex.submit(
            pooled.reward, "\\boxed{10^{10^{10}}}", Sample(prompt="p", answer="3")
        ).result()
    assert bomb.score == 0.0 and bomb.info["timeout"] is True


def test_batch_in_worker_processes_matches_inline(task, pooled):
    cases = _pick(10)
    got = pooled.rewards([c[0] for c in cases], [c[1] for c in cases])  # main thread, workers=2
    inline = task.rewards([c[0] for c in cases], [c[1] for c in cases])
    assert [r.score for r in got] == [c[2] for c in cases] == [r.score for r in inline]
    assert [r.info for r in got] == [r.info for r in inline]


def test_worker_missing_the_deadline_is_killed(pooled):
    pool = pooled._pool
    pool.grade([("1", "1")], timeout_s=1)  # at least one worker running
    before = list(pool._all)
    # The request keeps a worker busy for math-verify's 1 s; the backstop is 0.2 s.
    late = pool.grade([("3", "10^{10^{10}}")], timeout_s=1, deadline_s=0.2)
    assert late == [TIMED_OUT]
    killed = [w for w in before if w not in pool._all]
    assert len(killed) == 1 and killed[0].proc.poll() is not None
    assert pool._started == len(pool._all) == len(before) - 1
    # The pool carries on (with the other worker, or a new one).
    again = pool.grade([("1", "1"), ("2", "3")], timeout_s=1)
    assert [g.correct for g in again] == [True, False]


def test_task_pickles_without_its_processes():
    task = MathTask(train_path=FIXTURE_PATH, workers=2)
    clone = pickle.loads(pickle.dumps(task))
    assert clone.config == task.config and clone._pool.workers == 2


def test_last_number_fallback_is_an_option():
    sample = Sample(prompt="p", answer="1000")
    texts = ["so we get 1,000.<|im_end|>", "Answer: 999 (or 1000)"]
    plain, fallback = MathTask(), MathTask(answer_fallback="last_number")
    try:
        assert [r.score for r in plain.rewards(texts, [sample] * 2)] == [0.0, 0.0]
        # the phrase wins over the last number: "999 (or 1000)" is not 1000
        assert [r.score for r in fallback.rewards(texts, [sample] * 2)] == [1.0, 0.0]
    finally:
        plain.close()
        fallback.close()


def test_unknown_answer_fallback_names_the_key():
    from fp8rl.errors import ConfigError

    with pytest.raises(ConfigError, match="answer_fallback"):
        MathTask(answer_fallback="first")
