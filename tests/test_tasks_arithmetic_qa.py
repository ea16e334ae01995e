"""arithmetic_qa: questions in words, answers read from free text, splits by operand pair."""

import json
import operator
import re
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fp8rl.errors import ConfigError
from fp8rl.tasks import ArithmeticQATask, Sample, get_task, score_batch
from fp8rl.tasks.arithmetic_qa import garble_tokens, malformations
from fp8rl.tasks.base import STOP_STRINGS, cut_at_stops

ROOT = Path(__file__).resolve().parents[1]

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


# Garble rate (issue 48) ------------------------------------------------------------------

SAMPLES_FILE = ROOT / "docs" / "real-model" / "learn-run" / "run" / "samples.jsonl"
SAMPLE_ROWS = [json.loads(line) for line in SAMPLES_FILE.read_text(encoding="utf-8").splitlines()]
END = "<|im_end|>"


@pytest.mark.parametrize(
    "text,ended,kinds",
    [
        # well-formed chatty answers, the first four quoted from the real model's samples
        (
            "To solve this, we need to find the sum of the two numbers: 4 + 8 = 12. Here, the "
            "question indeed is multi-compartment. The answer is a clever combination of the "
            "numbers can be",
            False,  # cut at the token limit: not garbled for that
            (),
        ),
        ("7 + 1 = 8.\n\n7 + 1 equals 8.\n\n7 + 1 equals 8.", True, ()),  # "7 + 1" 3 times
        ("4 × 7 = 27.", True, ()),  # a math symbol; a wrong answer is no garble
        (
            '100 / 5 = 20\n8 "is" 2\n\nThis is "Задалаённая" declaration.\n\n8 * 5 still '
            "looks like the definition of ",
            False,
            (),  # one quoted Cyrillic word: 14 % of the non-space characters
        ),
        ("Sure! 7 + 5 = 12 — that’s “twelve”… ½ of 24, 12.0 ≈ 12 · 1.", True, ()),
        ("Hmm... well... 7 + 5 is 12... yes!", True, ()),
        ("12 12 12 12", True, ()),  # a run of 4: one short
        ("The answer is 12. " * 3, True, ()),  # a 3-gram 3 times: one short
        # no_number, the first two quoted from the samples
        ("Haggle: the act of creating, finding, or achieving something.", True, ("no_number",)),
        ("Seven and five are equal in terms of numerical values.", True, ("no_number",)),
        ("", False, ("no_number",)),
        # repeat
        ("The answer is 12. " * 4, True, ("repeat",)),
        ("12 12 12 12 12", True, ("repeat",)),
        ("So 7 + 5 = 12!!!!!", True, ("repeat",)),  # one punctuation token 5 times
        ("1 + 1 + 1 + 1 + 1 + 1 = 6", True, ("repeat",)),  # "1 + 1" 5 times
        ("the the the the the", True, ("no_number", "repeat")),
        # foreign: the first quoted from the samples (39 % of its non-space characters)
        ("☎☎☎2 + 9 = I\n☧☬☧2 = II\n☧☧☧ I = III", True, ("foreign",)),
        ("7 + 5 = 12, это двенадцать", True, ("foreign",)),
        ("12 个苹果", True, ("foreign",)),
        ("1234☎", True, ()),  # exactly 20 %: not over the threshold
        ("123☎", True, ("foreign",)),
        ("ÿ\x00\x01\x02\x03 12", True, ("foreign",)),  # byte salad
        # a cut inside a multi-byte character leaves a replacement character at the end
        ("12\ufffd", False, ()),
        ("12\ufffd", True, ("foreign",)),
        ("≈≈≈≈≈", True, ("no_number", "repeat")),  # math symbols are never foreign
    ],
)
def test_malformations_examples(text, ended, kinds):
    assert malformations(text, ended) == kinds
    # every kind is one the task declares, so the trainer logs its share
    assert set(kinds) <= set(ArithmeticQATask.garble_kinds)


def test_reward_sets_the_garble_info_from_the_text_before_the_end_of_turn():
    task = ArithmeticQATask()
    info = task.reward("7 + 5 = 12." + END + "☎☎☎☎☎☎ ☎☎☎☎☎☎", SEVEN_PLUS_FIVE).info
    assert (info["ended"], info["malformed"], info["malformations"]) == (True, False, ())
    info = task.reward("twelve twelve twelve twelve twelve", SEVEN_PLUS_FIVE).info
    assert (info["ended"], info["malformed"]) == (False, True)
    assert info["malformations"] == ("no_number", "repeat")
    scored = score_batch(task, ["Я думаю 12"], [SEVEN_PLUS_FIVE])
    assert scored.scores == [1.0] and scored.parsed == [True] and scored.malformed == [True]


def test_rewards_of_the_real_models_samples_are_unchanged():
    """The garble rate is new info only: every response of the committed GRPO run scores
    what the run logged."""
    task = ArithmeticQATask()
    assert len(SAMPLE_ROWS) == 600
    got = [
        task.reward(r["response"], Sample(prompt="p", answer=r["answer"])).score
        for r in SAMPLE_ROWS
    ]
    assert got == [r["reward"] for r in SAMPLE_ROWS]
    assert 0 < sum(got) < len(got)


WELL_FORMED = [
    cut_at_stops(r["response"], STOP_STRINGS)
    for r in SAMPLE_ROWS
    if not malformations(cut_at_stops(r["response"], STOP_STRINGS), True)
]
WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(response=st.sampled_from(WELL_FORMED), words=st.lists(WORD, min_size=1, max_size=12))
def test_appending_a_well_formed_sentence_of_new_words_keeps_a_response_well_formed(
    response, words
):
    # new words: every 3-gram that holds one occurs only in the sentence or at the seam
    old = set(garble_tokens(response))
    fresh = [w for w in dict.fromkeys(words) if w not in old]
    assume(fresh)
    sentence = " ".join(fresh) + " 1" + "0" * (len(response) + 1) + "."
    assert malformations(sentence, True) == ()
    assert malformations(response + " " + sentence, True) == ()


@settings(max_examples=100, deadline=None)
@given(
    phrase=st.lists(WORD, min_size=3, max_size=3),
    copies=st.integers(4, 8),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
def test_a_three_word_phrase_four_times_is_always_a_repeat(phrase, copies, before, after):
    text = " ".join([before, *[" ".join(phrase)] * copies, after])
    assert "repeat" in malformations(text, True)
    assert "repeat" in malformations(text, False)


@settings(max_examples=50, deadline=None)
@given(phrase=st.lists(WORD, min_size=3, max_size=3, unique=True))
def test_a_phrase_of_distinct_words_three_times_is_no_repeat(phrase):
    assert "repeat" not in malformations(" ".join(phrase * 3), True)


@settings(max_examples=100, deadline=None)
@given(ascii_chars=st.integers(0, 200), odd=st.integers(1, 60), spaces=st.integers(0, 50))
def test_foreign_is_a_share_of_the_non_space_characters_over_a_fifth(ascii_chars, odd, spaces):
    text = "x" * ascii_chars + " \n" * spaces + "Ж" * odd
    assert ("foreign" in malformations(text, True)) == (5 * odd > ascii_chars + odd)
