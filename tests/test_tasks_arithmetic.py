"""The arithmetic task: deterministic disjoint splits, exact reward, char tokenizer."""

import math
import re

import pytest
import torch

from fp8rl.errors import ConfigError
from fp8rl.models import tiny_qwen3
from fp8rl.tasks import ArithmeticConfig, ArithmeticTask, Sample
from fp8rl.tasks.arithmetic import evaluate

SMALL = dict(train_size=300, test_size=50)


def questions(task, split):
    return [s.question for s in task.samples(split)]


def python_value(question: str) -> int:
    # Python's own precedence is the independent reference; only digits and + - * reach eval.
    assert re.fullmatch(r"[0-9+\-*]+", question)
    return eval(question)


def test_same_seed_same_samples_other_seed_differs():
    a = ArithmeticTask(**SMALL, seed=7)
    b = ArithmeticTask(**SMALL, seed=7)
    c = ArithmeticTask(**SMALL, seed=8)
    assert a.samples("train") == b.samples("train")
    assert a.samples("test") == b.samples("test")
    assert questions(a, "train") != questions(c, "train")


def test_splits_disjoint_distinct_and_sized():
    task = ArithmeticTask(digits=2, ops="+-*", steps=2, **SMALL)
    train, test = questions(task, "train"), questions(task, "test")
    assert len(train) == 300 and len(test) == 50
    assert len(set(train)) == 300 and len(set(test)) == 50
    assert not set(train) & set(test)


def test_test_split_does_not_depend_on_train_size():
    assert questions(ArithmeticTask(train_size=10, test_size=40), "test") == questions(
        ArithmeticTask(train_size=500, test_size=40), "test"
    )


def test_whole_problem_space_can_be_drawn():
    # digits=1, "+", one step: 10 * 10 = 100 problems, all of them used.
    task = ArithmeticTask(digits=1, ops="+", steps=1, train_size=80, test_size=20)
    every = set(questions(task, "train")) | set(questions(task, "test"))
    assert every == {f"{a}+{b}" for a in range(10) for b in range(10)}


@pytest.mark.parametrize("digits,ops,steps", [(2, "+", 1), (3, "-", 1), (2, "+-*", 3), (1, "*", 2)])
def test_problems_match_config_and_python_arithmetic(digits, ops, steps):
    task = ArithmeticTask(digits=digits, ops=ops, steps=steps, train_size=60, test_size=20)
    for s in task.samples("train") + task.samples("test"):
        operands = re.split(r"[+\-*]", s.question)
        used = re.findall(r"[+\-*]", s.question)
        assert len(used) == steps and set(used) <= set(ops)
        for x in operands:
            assert len(x) == digits and (digits == 1 or x[0] != "0")
        assert s.prompt == s.question + "="
        assert s.answer == str(python_value(s.question))
        assert len(s.answer) + 1 <= task.max_new_tokens


def test_evaluate_precedence_by_hand():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([10, 2, 3, 1], ["-", "*", "-"]) == 3
    assert evaluate([5, 6, 7], ["*", "-"]) == 23
    assert evaluate([12, 34], ["+"]) == 46
    assert evaluate([5, 12], ["-"]) == -7


def test_max_new_tokens_by_hand():
    # 99*99*99 = 970299: 6 characters, no sign, plus <eos>.
    assert ArithmeticTask(digits=2, ops="*", steps=2, **SMALL).max_new_tokens == 7
    # 99+99 = 198 bounded by 99*99 = 9801: 4 characters, a "-" possible, plus <eos>.
    assert ArithmeticTask(digits=2, ops="+-", steps=1, **SMALL).max_new_tokens == 6


@pytest.mark.parametrize(
    "response,score,parsed",
    [
        ("46", 1.0, True),
        ("46<eos>", 1.0, True),
        ("46<eos>99+1", 1.0, True),  # text after the first <eos> is never read
        ("46<eos><pad><pad>", 1.0, True),
        ("46<pad>", 1.0, True),
        ("4", 0.0, True),  # partial
        ("466<eos>", 0.0, True),  # extra digit
        ("046", 0.0, True),  # not the exact text
        ("-46", 0.0, True),
        ("46 ", 0.0, False),  # trailing text before <eos> is not tolerated
        (" 46", 0.0, False),
        ("46=46", 0.0, False),
        ("", 0.0, False),
        ("<eos>46", 0.0, False),
    ],
)
def test_reward_exact_match(response, score, parsed):
    sample = Sample(prompt="12+34=", answer="46", question="12+34")
    result = ArithmeticTask(**SMALL).reward(response, sample)
    assert result.score == score
    assert result.info["parsed"] is parsed
    assert result.info["correct"] is (score == 1.0)


def test_reward_negative_answer():
    task = ArithmeticTask(**SMALL)
    sample = Sample(prompt="5-12=", answer="-7", question="5-12")
    assert task.reward("-7<eos>", sample).score == 1.0
    assert task.reward("7<eos>", sample).score == 0.0


def test_tokenizer_ids_by_hand_and_round_trip():
    task = ArithmeticTask(**SMALL)
    tok = task.tokenizer
    # <pad> <bos> <eos> <unk>, then "0123456789+-*=() ".
    assert task.vocab_size == len(tok) == 21 <= 64
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok("12+34=")["input_ids"] == [1, 5, 6, 14, 7, 8, 17]
    assert tok("46<eos>", add_special_tokens=False)["input_ids"] == [8, 10, 2]
    assert tok("9*(8-7)")["input_ids"] == [1, 13, 16, 18, 12, 15, 11, 19]
    for text in task.sft_texts("test"):
        ids = tok(text)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == text.removesuffix("<eos>")
        assert tok.decode(ids) == "<bos>" + text


def test_sft_examples_and_encoding():
    task = ArithmeticTask(**SMALL)
    s = task.samples("train")[0]
    assert task.sft_examples("train")[0] == (s.prompt, s.answer)
    assert task.sft_texts("train")[0] == s.prompt + s.answer + "<eos>"
    enc = task.encode_sft("train")
    tok = task.tokenizer
    width = enc["input_ids"].shape[1]
    # Reference: the whole sequence tokenized as one text, prompt and target never split.
    for i, text in enumerate(task.sft_texts("train")):
        full = tok(text)["input_ids"]
        n_prompt = 1 + len(task.samples("train")[i].prompt)  # <bos> and one id per character
        row_ids, row_labels = enc["input_ids"][i].tolist(), enc["labels"][i].tolist()
        assert row_ids == full + [tok.pad_token_id] * (width - len(full))
        assert row_labels[:n_prompt] == [-100] * n_prompt
        assert row_labels[n_prompt : len(full)] == full[n_prompt:]
        assert full[-1] == tok.eos_token_id
        assert all(x == -100 for x in row_labels[len(full) :])
        assert enc["attention_mask"][i].tolist() == [1] * len(full) + [0] * (width - len(full))


def test_tiny_qwen3_fits_the_vocabulary():
    task = ArithmeticTask(**SMALL)
    model = tiny_qwen3(vocab_size=task.vocab_size)
    enc = task.encode_sft("test")
    out = model(
        input_ids=enc["input_ids"][:8],
        attention_mask=enc["attention_mask"][:8],
        labels=enc["labels"][:8],
    )
    assert out.logits.shape[-1] == task.vocab_size
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(digits=0), "digits"),
        (dict(ops="/"), "ops"),
        (dict(ops=""), "ops"),
        (dict(ops="++"), "ops"),
        (dict(steps=0), "steps"),
        (dict(train_size=-1), "train_size"),
        (dict(digits=1, ops="+", steps=1, train_size=90, test_size=20), "train_size \\+ test_size"),
    ],
)
def test_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        ArithmeticConfig(**kwargs)


def test_unknown_split():
    with pytest.raises(ConfigError, match="split"):
        ArithmeticTask(**SMALL).samples("validation")


@pytest.mark.slow
def test_supervised_warm_start_learns_two_digit_addition():
    """The CPU demo's premise: a short warm-start reaches a useful accuracy (about 60 %)."""
    threads = torch.get_num_threads()
    # One thread: on a shared machine, OpenMP threads spinning at barriers cost far more
    # than they bring to a model this small.
    torch.set_num_threads(1)
    try:
        _warm_start_and_check()
    finally:
        torch.set_num_threads(threads)


def _warm_start_and_check():
    task = ArithmeticTask()
    model = tiny_qwen3(vocab_size=task.vocab_size)
    data = task.encode_sft("train")
    steps = 300
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    # Warmup then cosine decay: at a constant 3e-3 the accuracy jump comes late and erratically.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 15) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, data["input_ids"].shape[0], (64,), generator=gen)
        loss = model(**{k: v[idx] for k, v in data.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    model.eval()
    tok = task.tokenizer
    samples = task.samples("test")[:200]
    enc = tok([s.prompt for s in samples], return_tensors="pt")  # equal lengths: no padding
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=task.max_new_tokens,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :])
    accuracy = sum(r.score for r in task.rewards(texts, samples)) / len(samples)
    assert accuracy >= 0.5
