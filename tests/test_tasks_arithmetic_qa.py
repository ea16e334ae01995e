"""arithmetic_qa: questions in words, answers read from free text, splits by operand pair."""

import operator
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.errors import ConfigError
from fp8rl.tasks import ArithmeticQATask, Sample, get_task

VALUE = {"+": operator.add, "-": operator.sub, "*": operator.mul}
QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def pairs_of(samples):
    out = set()
    for s in samples:
        a, _, b = QUESTION.fullmatch(s.prompt).groups()
        out.add(frozenset((int(a), int(b))))
    return out


def check_splits(task):
    train, test = task.samples("train"), task.samples("test")
    assert pairs_of(train).isdisjoint(pairs_of(test))
    for s in train + test:
        a, op, b = QUESTION.fullmatch(s.prompt).groups()
        assert s.answer == str(VALUE[op](int(a), int(b)))
        assert op in task.config.ops
        assert s.question == f"{a} {op} {b}"
    assert len({s.prompt for s in train}) == len(train)
    assert len({s.prompt for s in test}) == len(test)
    return train, test


@pytest.mark.parametrize("ops", ["+", "*", "-", "+*", "+-*"])
@pytest.mark.parametrize("digits", [1, 2])
def test_no_operand_pair_in_both_splits_with_default_sizes(ops, digits):
    train, test = check_splits(ArithmeticQATask(ops=ops, digits=digits))
    problems = (10 if digits == 1 else 90) ** 2 * len(ops)
    # the defaults: a fifth of the problems for test (at most 500), the rest for train
    # (at most 4000); test takes whole pairs, so train is short of it by less than one pair
    assert len(test) == min(500, -(-problems // 5))
    assert min(4000, problems - len(test) - 2 * len(ops) + 1) <= len(train) <= 4000


@settings(max_examples=40, deadline=None)
@given(
    ops=st.sampled_from(["+", "*", "+*", "+-*"]),
    seed=st.integers(0, 1000),
    test_size=st.integers(1, 60),
    train_share=st.floats(0, 1),
)
def test_no_operand_pair_in_both_splits_for_any_sizes(ops, seed, test_size, train_share):
    room = 100 * len(ops) - test_size - (2 * len(ops) - 1)
    train_size = int(train_share * room)
    task = ArithmeticQATask(ops=ops, seed=seed, test_size=test_size, train_size=train_size)
    train, test = check_splits(task)
    assert (len(train), len(test)) == (train_size, test_size)


def test_split_is_a_pure_function_of_the_config():
    a, b = ArithmeticQATask(seed=3), ArithmeticQATask(seed=3)
    assert a.samples("train") == b.samples("train") and a.samples("test") == b.samples("test")
    assert ArithmeticQATask(seed=4).samples("test") != a.samples("test")


def test_prompt_and_registry():
    task = get_task("arithmetic_qa", ops="+", template="Q: {question} =")
    s = task.samples("test")[0]
    assert s.prompt == f"Q: {s.question} =" and s.prompt_ids is None
    assert task.tokenizer is None and task.chat_default  # the model's tokenizer, chat on


SEVEN_PLUS_FIVE = Sample(prompt="What is 7 + 5?", answer="12", question="7 + 5")


@pytest.mark.parametrize(
    "response,answer,score,parsed",
    [
        ("7 + 5 = 12.", "12", 1.0, True),
        ("The answer is 12, not 13", "12", 1.0, True),  # the phrase, then its first number
        ("The answer is 13, not 12", "12", 0.0, True),
        (r"\boxed{3} and then 5", "3", 1.0, True),  # a box beats the last number
        ("no digits here", "12", 0.0, False),
        ("3 - 8 = -5", "-5", 1.0, True),
        ("3 - 8 = 5", "-5", 0.0, True),
        ("so 1,000 in all", "1000", 1.0, True),
        ("That makes 12.0", "12", 1.0, True),  # compared as numbers
        ("That makes 12.5", "12", 0.0, True),
        ("12<|im_end|> or 13", "12", 1.0, True),  # nothing after the end of turn is read
        ("It is 13<|im_end|>12", "12", 0.0, True),
    ],
)
def test_reward_examples(response, answer, score, parsed):
    task = ArithmeticQATask()
    result = task.reward(response, Sample(prompt="p", answer=answer))
    assert (result.score, result.info["parsed"], result.info["correct"]) == (
        score,
        parsed,
        score == 1.0,
    )


def test_fallback_none_needs_a_phrase_or_a_box():
    task = ArithmeticQATask(answer_fallback="none")
    assert task.reward("7 + 5 = 12.", SEVEN_PLUS_FIVE).info["parsed"] is False
    assert task.reward("The answer is 12.", SEVEN_PLUS_FIVE).score == 1.0


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"digits": 4}, "digits"),
        ({"digits": 0}, "digits"),
        ({"ops": "+/"}, "ops"),
        ({"ops": "++"}, "ops"),
        ({"ops": ""}, "ops"),
        ({"test_size": 0}, "test_size"),
        ({"train_size": -1}, "train_size"),
        ({"train_size": 200}, "train_size \\+ test_size"),  # 200 problems in all
        ({"test_size": 199}, "train_size \\+ test_size"),
        ({"template": "What?"}, "template"),
        ({"answer_fallback": "first"}, "answer_fallback"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_options_name_their_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        ArithmeticQATask(**kwargs)
