"""Final-answer extraction rules (pure string work)."""

import pytest

from fp8rl.tasks import extract_answer
from fp8rl.tasks.answer_extraction import boxed_answers


@pytest.mark.parametrize(
    "text,expected",
    [
        (r"so the answer is \boxed{5}.", "5"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),  # nested braces
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not count
        (r"\fbox{7}", "7"),
        (r"\boxed 5$.", "5"),  # brace-less form
        (r"\boxed {12}", "12"),
        (r"first \boxed{1}, then \boxed{2}", "2"),  # the last box
        (r"\boxed{1} and \boxed{2} and \boxed{3", "2"),  # an unclosed box is skipped
        (r"\boxed{\frac{1}{2}", None),
        (r"\boxed{}", None),
        (r"\boxed{  }", None),
        (r"\boxed{9} but the answer is 3", "9"),  # a box beats an answer phrase
        (r"\boxedx{3}", None),  # another macro
        ("The answer is 3/4.", "3/4"),
        ("The final answer is $\\frac{3}{4}$.", r"\frac{3}{4}"),
        ("**Final Answer:** \\(\\frac{2}{3}\\)", r"\frac{2}{3}"),
        ("**Answer:** 12", "12"),
        ("Answer: $34$", "34"),
        ("answer = -5", "-5"),
        ("The answer is 3.5. Then we check.", "3.5"),
        ("The answer is:\n\n$$\\frac{3}{4}$$\n", r"\frac{3}{4}"),
        ("Answer: 1\nwait.\nAnswer: 2", "2"),  # the last phrase
        ("The answer is (1, 2), as shown.", "(1, 2), as shown"),  # cut at a full stop only
        ("The answer isn't obvious; 42", None),
        ("6 times 7 is 42", None),  # no last-number fallback
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_boxed_answers_in_order():
    assert boxed_answers(r"\boxed{a} x \fbox{b} \boxed{c") == ["a", "b"]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("7 + 5 = 12.", "12"),  # the sentence's full stop is not a decimal point
        ("The answer is 12, not 13", "12, not 13"),  # an answer phrase beats the fallback
        (r"\boxed{3} and then 5", "3"),  # so does a box
        ("no digits here", None),
        ("7 - 12 = -5", "-5"),  # a sign after "=" is a sign
        ("5-3", "3"),  # a minus after a digit is a subtraction
        ("x = \u22124", "-4"),  # the Unicode minus
        ("it costs 1,000 dollars", "1000"),  # thousands commas dropped
        ("the list 1,2", "2"),  # a comma not followed by three digits separates
        ("about 12.0 units.", "12.0"),
        ("", None),
    ],
)
def test_last_number_fallback(text, expected):
    assert extract_answer(text, fallback="last_number") == expected


def test_fallback_none_keeps_the_old_rule():
    assert extract_answer("7 + 5 = 12.") is None
    assert extract_answer("7 + 5 = 12.", fallback="none") is None


def test_unknown_fallback_is_refused():
    with pytest.raises(ValueError, match="fallback"):
        extract_answer("1", fallback="first_number")
