"""Issue 13, part B: hostile responses, non-finite values and bad inputs.

Each test feeds one fault and checks what the docs (docs/reliability.md, "Bad input and
non-finite values") promise: a bounded reward, a skipped update, or a one-line error.
"""

import time

import pytest

from fp8rl.tasks import MathTask, Sample
from fp8rl.tasks.grading import grade_strings

# ---------------------------------------------------------------------------------------
# Item 6: a response's reward is linear in its length and ends within 3 x timeout_s.

MB = 1 << 20


def _fill(unit: str, size: int = MB) -> str:
    return (unit * (size // len(unit) + 1))[:size]


ADVERSARIAL = {
    # (text, whether it states an answer at all)
    "unclosed_boxes": (_fill("\\boxed{"), False),
    "deep_nesting": ("\\boxed{" * 70000 + "3" + _fill("}", MB - 70000 * 7 - 1), True),
    "many_boxes": (_fill("\\boxed{12} "), True),
    "one_huge_box": ("\\boxed{" + _fill("1+", MB - 9) + "1}", True),
    "huge_braces": ("\\boxed{" + "{" * (MB // 2 - 8) + "}" * (MB // 2 - 8) + "}", True),
    "nested_fracs": ("\\boxed{" + "\\frac{1}{" * (MB // 10) + "2" + "}" * (MB // 10) + "}", True),
    "wrapped_phrase": ("Answer: " + "\\(" * (MB // 4) + "x" + "\\)" * (MB // 4), True),
    "unclosed_braces_only": (_fill("{"), False),
}

# Generous: the promise is 3 x timeout_s = 3 s; the rest is slack for a loaded machine. The
# quadratic extraction this replaced took 71 s on 20,000 unclosed boxes (140 kB).
BOUND_S = 15.0


@pytest.fixture(scope="module")
def fast_task():
    t = MathTask(timeout_s=1)
    yield t
    t.close()


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_one_megabyte_of_adversarial_text_is_scored_within_the_time_limit(fast_task, name):
    text, states_answer = ADVERSARIAL[name]
    assert len(text) >= MB - 16
    sample = Sample(prompt="p", answer="7")  # matches none of the texts
    t0 = time.monotonic()
    result = fast_task.reward(text, sample)
    elapsed = time.monotonic() - t0
    assert elapsed < BOUND_S, (name, elapsed)
    assert result.score == 0.0
    if not states_answer:
        assert result.info["extracted"] is None and result.info["timeout"] is False
    elif len(result.info["extracted"]) > 1000:
        # A huge extracted answer can only be cut off by the time limit.
        assert result.info["timeout"] is True, (name, result.info["extracted"][:40])


def test_deeply_nested_boxes_extract_the_innermost_and_grade_right(fast_task):
    text, _ = ADVERSARIAL["deep_nesting"]
    result = fast_task.reward(text, Sample(prompt="p", answer="3"))
    assert result.info["extracted"] == "3" and result.score == 1.0


def test_grading_total_budget_bounds_all_parses_and_comparisons():
    grade_strings("1", "1", timeout_s=1)  # import math-verify outside the timed part
    t0 = time.monotonic()
    g = grade_strings("3", "10^{10^{10}}", timeout_s=1, budget_s=0.5)  # under a whole second
    assert g.timeout is True and g.correct is False
    assert time.monotonic() - t0 < 0.5
    # The default budget, 3 x timeout_s, leaves ordinary answers alone.
    assert grade_strings("\\frac{3}{4}", "0.75", timeout_s=1).correct is True


def test_extraction_time_counts_against_the_budget(monkeypatch):
    import types

    import fp8rl.tasks.math_task as math_task

    clock = iter([0.0, 10.0])  # extraction "took" 10 s of a 3 s budget (math_task's clock only)
    monkeypatch.setattr(math_task, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    task = MathTask(timeout_s=1)
    result = task.reward("\\boxed{3}", Sample(prompt="p", answer="3"))
    assert result.score == 0.0 and result.info["timeout"] is True
