"""chain_arithmetic: a long-answer task graded on its final answer only."""

from __future__ import annotations

import pytest

from fp8rl.errors import ConfigError
from fp8rl.tasks import ChainArithmeticTask, get_task
from fp8rl.tasks.arithmetic import ArithmeticConfig, generate_problems
from fp8rl.tasks.chain_arithmetic import parse_final_answer, scratchpad

EOS = "<eos>"


@pytest.fixture(scope="module")
def task():
    return get_task("chain_arithmetic")


def test_reference_solution_format():
    assert scratchpad("10+92+30+28+79") == ("10+92=102 102+30=132 132+28=160 160+79=239 (239)", 239)
    assert scratchpad("41-90+57") == ("41-90=-49 -49+57=8 (8)", 8)
    with pytest.raises(ValueError):
        scratchpad("2*3")


def test_generation_is_deterministic_per_seed():
    a, b = ChainArithmeticTask(seed=3), ChainArithmeticTask(seed=3)
    assert a.samples("train") == b.samples("train") and a.samples("test") == b.samples("test")
    assert [s.meta["solution"] for s in a.samples("test")] == [
        s.meta["solution"] for s in b.samples("test")
    ]
    c = ChainArithmeticTask(seed=4)
    assert a.samples("test") != c.samples("test")
    tr, te = {s.question for s in a.samples("train")}, {s.question for s in a.samples("test")}
    assert len(tr) == 4000 and len(te) == 500 and not tr & te
    # The problems are the arithmetic task's for the same fields.
    rows = generate_problems(ArithmeticConfig(steps=4, seed=3))
    assert [(s.question, s.answer) for s in a.samples("test")] == [
        (q, str(v)) for q, v in rows["test"]
    ]


@pytest.mark.parametrize("ops", ["+", "+-"])
def test_scratchpad_lengths_in_tokens_are_30_to_80(ops):
    t = get_task("chain_arithmetic", ops=ops)
    tok = t.tokenizer
    lengths = []
    for s in t.samples("train") + t.samples("test"):
        ids = tok(s.meta["solution"], add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        lengths.append(len(ids))
    assert 30 <= min(lengths) and max(lengths) <= 80
    assert max(lengths) + 1 <= t.max_new_tokens <= 80


def test_reference_solutions_score_one(task):
    for s in task.samples("test"):
        sol = s.meta["solution"]
        for text in (sol + EOS, sol, sol + EOS + "garbage (1)", sol + "<pad><pad>"):
            r = task.reward(text, s)
            assert r.score == 1.0 and r.info["correct"] and r.info["parsed"], text


def test_wrong_final_answer_scores_zero_even_with_a_correct_chain(task):
    s = task.samples("test")[0]
    chain = s.meta["solution"].rsplit(" ", 1)[0]
    wrong = str(int(s.answer) + 1)
    r = task.reward(f"{chain} ({wrong}){EOS}", s)
    assert r.score == 0.0 and r.info["parsed"] and not r.info["correct"]
    assert r.info["extracted"] == wrong
    # The chain's last total is right, but the answer was never given in parentheses.
    r = task.reward(chain + EOS, s)
    assert r.score == 0.0 and not r.info["parsed"]


def test_only_the_final_answer_is_graded(task):
    s = task.samples("test")[0]
    assert task.reward(f"1+1=3 ({s.answer}){EOS}", s).score == 1.0
    assert task.reward(f"({s.answer}){EOS}", s).score == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        EOS,
        "(",
        ")",
        "()",
        "(((",
        "12+34=",
        "(-)",
        "(12",
        "12)",
        "(1)(2)",
        "(1) 2",
        " (0239)",
        "(239) ",
        "(2 39)",
        "(+239)",
        "(239)(239)",
        "x" * 5000,
        "(" * 3000 + "239" + ")" * 3000,
        "\n(239)\n",
        "<unk><unk>",
        "10+92=102 (239",
        "-(239)x",
    ],
)
def test_garbled_responses_score_zero_and_do_not_raise(task, text):
    s = next(x for x in task.samples("train") if x.answer == "239")
    r = task.reward(text, s)
    assert r.score == 0.0 and not r.info["correct"]


def test_parse_final_answer():
    assert parse_final_answer("1+2=3 (3)") == "3"
    assert parse_final_answer("(-12)") == "-12"
    assert parse_final_answer("(1) (2)") is None
    assert parse_final_answer("(3) ") is None


def test_sft_examples_are_prompt_and_solution(task):
    pairs = task.sft_examples("train")
    s = task.samples("train")[0]
    assert pairs[0] == (s.prompt, s.meta["solution"]) and s.prompt == s.question + "="
    assert task.sft_texts("train")[0] == s.prompt + s.meta["solution"] + EOS


@pytest.mark.parametrize(
    "bad",
    [
        dict(ops="*"),
        dict(ops="+*"),
        dict(ops=""),
        dict(steps=0),
        dict(digits=0),
        dict(digits=1, steps=1, train_size=200),
    ],
)
def test_bad_config_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        get_task("chain_arithmetic", **bad)


def test_unknown_field_is_a_config_error():
    with pytest.raises(ConfigError, match="chain_arithmetic.scratchpad"):
        get_task("chain_arithmetic", scratchpad=True)
