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


# Garble rate: info["malformed"] and its kinds, on hand-written responses to the 4-operator
# problem 10+92+30+28+79 = 239 (reference "10+92=102 102+30=132 132+28=160 160+79=239 (239)").
SOL = "10+92=102 102+30=132 132+28=160 160+79=239 (239)"


@pytest.mark.parametrize(
    "text",
    [
        SOL + EOS,
        "(239)" + EOS,  # the chain dropped: RL may shorten it
        "10+92=102 (239)" + EOS,
        "10+92=100 100+30=130 (130)" + EOS,  # wrong totals and answer: an error, not a garble
        "41-90=-49 -49+57=8 (8)" + EOS,
        SOL + "<pad><pad>",
    ],
)
def test_well_formed_responses_are_not_malformed(task, text):
    s = _sample(task)
    r = task.reward(text, s)
    assert r.info["malformed"] is False and r.info["malformations"] == ()


@pytest.mark.parametrize(
    "text, kinds",
    [
        (SOL, ("unterminated",)),
        ("10+92=102 102+30=132" + EOS, ("no_answer",)),
        ("" + EOS, ("no_answer",)),
        ("((239)" + EOS, ("no_answer",)),
        ("10+92=102 102*30=132 (239)" + EOS, ("off_format",)),  # "*": outside the format
        ("10+92=102 <unk> (239)" + EOS, ("off_format",)),
        ("10+92=102 102+30=132(239)" + EOS, ("off_format",)),  # no space before "(N)"
        ("10+92=102  (239)" + EOS, ("off_format",)),  # two spaces
        ("10+92=102 102+ (239)" + EOS, ("off_format",)),  # a step cut short
        ("10+92=102 10+92=102 (239)" + EOS, ("repeated",)),
        ("1+1=2 2+1=3 3+1=4 4+1=5 5+1=6 (239)" + EOS, ("repeated",)),  # 5 steps for 4 operators
        ("10+92=102 10+92=102 10+92=102 10+9", ("unterminated", "no_answer", "repeated")),
        ("10+92=102 1*(239", ("unterminated", "off_format", "no_answer")),
    ],
)
def test_each_malformation_kind(task, text, kinds):
    s = _sample(task)
    r = task.reward(text, s)
    assert r.info["malformations"] == kinds and r.info["malformed"] is True


def _sample(task):
    from fp8rl.tasks import Sample

    return Sample(prompt="10+92+30+28+79=", answer="239", question="10+92+30+28+79")


def test_malformations_counts_the_problems_operators():
    from fp8rl.tasks.chain_arithmetic import malformations

    two = "1+1=2 2+1=3 (3)"
    assert malformations(two, True, 2) == () and malformations(two, True, 1) == ("repeated",)


# Variable number of steps ----------------------------------------------------------------


def test_steps_max_draws_each_problems_length_from_the_range():
    t = get_task("chain_arithmetic", steps=2, steps_max=5, train_size=600, test_size=100)
    counts = {}
    for s in t.samples("train") + t.samples("test"):
        k = s.question.count("+")
        counts[k] = counts.get(k, 0) + 1
        assert s.meta["solution"].count("=") == k
        r = t.reward(s.meta["solution"] + EOS, s)
        assert r.score == 1.0 and r.info["malformed"] is False
    assert sorted(counts) == [2, 3, 4, 5] and min(counts.values()) > 100  # about 175 each
    # 5 steps of "AAA+BB=CCC " (11 characters, totals <= 6 * 99 = 594) + "(CCC)" + <eos>
    assert t.max_new_tokens == 5 * 11 + 5 + 1 == 61
    tr, te = {s.question for s in t.samples("train")}, {s.question for s in t.samples("test")}
    assert len(tr) == 600 and len(te) == 100 and not tr & te
    again = get_task("chain_arithmetic", steps=2, steps_max=5, train_size=600, test_size=100)
    assert again.samples("train") == t.samples("train")


def test_steps_max_none_or_equal_to_steps_is_the_fixed_length_task():
    fixed = ChainArithmeticTask(seed=3)
    assert fixed.config.steps_max is None and fixed.max_new_tokens == 50
    same = ChainArithmeticTask(seed=3, steps_max=4)
    assert same.samples("train") == fixed.samples("train")
    assert same.samples("test") == fixed.samples("test")


@pytest.mark.parametrize(
    "bad",
    [
        dict(steps=4, steps_max=3),
        dict(steps_max="5"),
        dict(steps_max=5.0),
        dict(steps=0, steps_max=2),
        # 10**2 + 10**3 = 1100 one-digit problems with 1 or 2 "+"
        dict(digits=1, steps=1, steps_max=2, train_size=1001, test_size=100),
    ],
)
def test_bad_steps_max_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        get_task("chain_arithmetic", **bad)


def test_steps_max_problem_space_counts_every_length():
    t = get_task("chain_arithmetic", digits=1, steps=1, steps_max=2, train_size=1000, test_size=100)
    assert len({s.question for s in t.samples("train") + t.samples("test")}) == 1100


# Any-order reference chains ---------------------------------------------------------------


def _steps(chain: str) -> list[tuple[int, int, int]]:
    """(a, b, c) of each "a+b=c" step, parsed independently of the task's own patterns."""
    out = []
    for piece in chain.split(" "):
        lhs, c = piece.split("=")
        a, b = lhs.split("+")
        out.append((int(a), int(b), int(c)))
    return out


def test_any_order_scratchpad_adds_every_operand_once_with_right_totals():
    import random

    from fp8rl.tasks.chain_arithmetic import any_order_scratchpad, malformations

    question, operands = "10+92+30+28+79", [10, 92, 30, 28, 79]
    rng = random.Random(0)
    for _ in range(200):
        text, value = any_order_scratchpad(question, rng)
        chain, final = text.rsplit(" ", 1)
        steps = _steps(chain)
        assert value == 239 and final == "(239)" and malformations(text, True, 4) == ()
        # the first step adds two operands; every later one adds an operand to the total
        total = steps[0][0] + steps[0][1]
        added = [steps[0][0], steps[0][1]]
        for (a, b, c), nxt in zip(steps, steps[1:] + [None], strict=True):
            assert a + b == c
            if nxt is not None:
                assert total == c and total in nxt[:2]
                x = nxt[1] if nxt[0] == total else nxt[0]
                added.append(x)
                total += x
        assert sorted(added) == sorted(operands)
    with pytest.raises(ValueError):
        any_order_scratchpad("41-90+57", rng)


def test_any_order_draws_every_order_and_both_ways_round():
    import random

    from fp8rl.tasks.chain_arithmetic import any_order_scratchpad

    # 3 operands: the first step's ordered pair (6) x the second step either way round (2)
    # = 12 chains, equally likely (distinct sums: no two chains print alike)
    rng = random.Random(1)
    seen = {}
    for _ in range(4800):
        text = any_order_scratchpad("11+22+44", rng)[0]
        seen[text] = seen.get(text, 0) + 1
    assert len(seen) == 12 and min(seen.values()) > 320  # 400 expected each
    assert "44+11=55 22+55=77 (77)" in seen and "11+22=33 33+44=77 (77)" in seen


def test_order_any_keeps_the_problems_and_rewards_and_varies_the_chains():
    fixed = get_task("chain_arithmetic", steps=2, steps_max=5, train_size=300, test_size=50)
    anyo = get_task(
        "chain_arithmetic", steps=2, steps_max=5, train_size=300, test_size=50, order="any"
    )
    for split in ("train", "test"):
        a, b = fixed.samples(split), anyo.samples(split)
        assert [(s.question, s.answer) for s in a] == [(s.question, s.answer) for s in b]
    differ = 0
    for s, t in zip(fixed.samples("train"), anyo.samples("train"), strict=True):
        sol = t.meta["solution"]
        r = anyo.reward(sol + EOS, t)
        assert r.score == 1.0 and not r.info["malformed"] and len(sol) <= anyo.max_new_tokens - 1
        differ += sol != s.meta["solution"]
    assert differ > 250  # the fixed-order chain is 1 of at least 3! * 2 = 12
    again = get_task(
        "chain_arithmetic", steps=2, steps_max=5, train_size=300, test_size=50, order="any"
    )
    assert again.sft_examples("train") == anyo.sft_examples("train")
    assert anyo.max_new_tokens == fixed.max_new_tokens


@pytest.mark.parametrize("bad", [dict(order="any", ops="+-"), dict(order="random")])
def test_bad_order_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="order"):
        get_task("chain_arithmetic", **bad)
