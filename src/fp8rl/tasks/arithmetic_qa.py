"""Arithmetic questions in words for a pretrained chat model: "What is 7 + 5?".

Unlike `arithmetic`, the task keeps the model's own tokenizer, and the answer is free text:
the reward reads it with the math answer rules (a `\\boxed{}`, else an "answer is" phrase,
else, with `answer_fallback="last_number"`, the last number; answer_extraction) and takes the
first number of what it read, compared as a number ("12.0" and "1,000" are 12 and 1000).

The split is by operand pair: every unordered pair {a, b} of operands lands in one split with
all its questions (a op b and b op a, for every op), so no test question shares its operands
with a train question, whatever the order or the operator.

Garbled responses (info["malformed"], the garble rate `rollout/malformed_frac`): the reward
reads one number, the garble rate looks at the whole free text. `malformations(text, ended)`
lists, in this order, the kinds a response (cut at its first stop string) shows. The
thresholds are calibrated on 600 responses of a real 135M chat model's GRPO run
(bench/real_model_garble.py, docs/real-model/garble-rates.md), answers of at most 48
tokens; much longer answers would need them rescaled.

- "no_number": no number anywhere (the answer rules' number pattern finds none), so
  nothing the reward could read. Spelled-out numbers ("Seven and five") count as none: the
  reward cannot read them either.
- "repeat": degenerate repetition: one 3-gram of tokens (words and single punctuation
  marks, lowercased) 4 or more times, or one token 5 or more times in a row. Why 4, not 3:
  ordinary chatty answers restate the question ("7 * 2 = 14 ... 7 * 2 = 14 ... 7 * 2") or
  reuse a phrase ("the reciprocal of") 3 times within 48 tokens (15 of the 600 do), none
  4 times, while a short sentence stuck in a loop reaches 4 copies. Why 5 in a row: an
  ellipsis or a code fence gives 3 (no response had more), a stuck token far more.
- "foreign": more than 20 % of the non-space characters outside printable ASCII, common
  math symbols ("×", "÷", "−", "·", "²", ...) and typographic punctuation: byte salad,
  symbol runs or another script. Why 20 %: of the 600, answers in English with stray
  symbols or one quoted foreign word reach at most 14.3 %, the one symbol salad 39.1 %;
  a sentence in another script is near 100 %.

A response cut at the token limit (`ended` False) is not garbled for that alone: most of a
start model's answers are. `ended` only drops the replacement character that a cut inside
a multi-byte character leaves at the end.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from fp8rl.errors import ConfigError

from .answer_extraction import extract_answer, numbers
from .arithmetic import OPS, evaluate, operand_range
from .base import (
    STOP_STRINGS,
    RewardResult,
    Sample,
    Task,
    check_fallback,
    check_split,
    check_stop_strings,
    check_template,
    cut_at_stops,
    is_int,
)

MAX_DIGITS = 3
DEFAULT_TEST = 500  # test_size=None: a fifth of the problems, at most this many
DEFAULT_TRAIN = 4000  # train_size=None: every problem of the train pairs, at most this many

Problem = tuple[int, str, int]  # (a, op, b)

# Garble thresholds (module docstring).
REPEAT_NGRAM, REPEAT_NGRAM_COUNT, REPEAT_RUN = 3, 4, 5
FOREIGN_SHARE = 0.2
GARBLE_TOKEN = re.compile(r"\w+|[^\w\s]")
ALLOWED_NON_ASCII = frozenset(
    "×÷−·⋅∙∗±≈≠≤≥√π∞°′″²³¹⁰⁴⁵⁶⁷⁸⁹½¼¾⅓⅔∑∏∫∂∆∈⇒→←"  # math
    "–—‘’“”…•«»€£"  # typographic punctuation
)


@dataclass(frozen=True)
class ArithmeticQAConfig:
    ops: str = "+*"
    digits: int = 1  # operands with exactly this many digits (0-9 for one digit)
    train_size: int | None = None
    test_size: int | None = None
    seed: int = 0
    template: str = "What is {question}?"
    answer_fallback: str = "last_number"
    stop_strings: tuple[str, ...] = STOP_STRINGS

    def __post_init__(self):
        if not is_int(self.digits) or not 1 <= self.digits <= MAX_DIGITS:
            raise ConfigError("digits", self.digits, f"an integer in 1..{MAX_DIGITS}")
        ops = self.ops
        if not isinstance(ops, str) or not ops or set(ops) - set(OPS) or len(set(ops)) < len(ops):
            raise ConfigError("ops", ops, f"a non-empty string of distinct characters from {OPS!r}")
        if not is_int(self.seed):
            raise ConfigError("seed", self.seed, "an integer")
        check_template(self.template)
        check_fallback(self.answer_fallback)
        check_stop_strings(self.stop_strings)
        total = problem_count(self)
        if self.test_size is not None and (not is_int(self.test_size) or self.test_size < 1):
            raise ConfigError("test_size", self.test_size, "null or an integer >= 1")
        if self.train_size is not None and (not is_int(self.train_size) or self.train_size < 0):
            raise ConfigError("train_size", self.train_size, "null or an integer >= 0")
        # the test split takes whole pairs: it may overshoot by one pair's problems less one
        room = total - self.test_target - (2 * len(ops) - 1)
        if self.test_target > total - 2 * len(ops) or (
            self.train_size is not None and self.train_size > room
        ):
            raise ConfigError(
                "train_size + test_size",
                f"{self.train_size} + {self.test_size}",
                f"sizes that leave whole operand pairs to each split: with digits={self.digits} "
                f"and ops={ops!r} there are {total} problems, and train_size <= {max(room, 0)} "
                f"for test_size={self.test_target}",
            )

    @property
    def test_target(self) -> int:
        """The test split's size: test_size, or a fifth of the problems, at most 500."""
        if self.test_size is not None:
            return self.test_size
        return min(DEFAULT_TEST, math.ceil(problem_count(self) / 5))


def problem_count(cfg: ArithmeticQAConfig) -> int:
    lo, hi = operand_range(cfg.digits)
    return (hi - lo + 1) ** 2 * len(cfg.ops)


def pair_problems(pair: tuple[int, int], ops: str) -> list[Problem]:
    """Every question on the unordered pair {a, b}: both orders (one when a == b), each op."""
    a, b = pair
    orders = [(a, b)] if a == b else [(a, b), (b, a)]
    return [(x, op, y) for op in ops for x, y in orders]


def split_problems(cfg: ArithmeticQAConfig) -> dict[str, list[Problem]]:
    """The problems of each split, a pure function of the config; no unordered operand pair
    is in both. Pairs are shuffled once; test takes pairs until it has test_size problems,
    train the next ones until it has train_size; each split is then shuffled and trimmed."""
    lo, hi = operand_range(cfg.digits)
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(a, hi + 1)]
    # A str seed is hashed with SHA-512: the streams are stable across runs and platforms.
    rng = random.Random(f"fp8rl/arithmetic_qa/{cfg.seed}")
    rng.shuffle(pairs)
    test_pool: list[Problem] = []
    taken = 0
    while len(test_pool) < cfg.test_target:
        test_pool += pair_problems(pairs[taken], cfg.ops)
        taken += 1
    n_train = cfg.train_size
    if n_train is None:
        n_train = min(DEFAULT_TRAIN, problem_count(cfg) - len(test_pool))
    # train takes the next pairs until it has enough: all of them for one or two digits,
    # never the 1.6 million problems of three
    train_pool: list[Problem] = []
    for pair in pairs[taken:]:
        if len(train_pool) >= n_train:
            break
        train_pool += pair_problems(pair, cfg.ops)
    rng.shuffle(test_pool)
    rng.shuffle(train_pool)
    return {"test": test_pool[: cfg.test_target], "train": train_pool[:n_train]}


def question_text(problem: Problem) -> str:
    a, op, b = problem
    return f"{a} {op} {b}"


def answer_value(answer: str | None) -> Fraction | None:
    """The first number of an extracted answer as an exact fraction, or None."""
    found = numbers(answer) if answer else []
    return Fraction(found[0]) if found else None


def garble_tokens(text: str) -> list[str]:
    """Words and single punctuation marks, lowercased: what "repeat" counts."""
    return [t.lower() for t in GARBLE_TOKEN.findall(text)]


def longest_ngram_count(tokens: list[str], n: int = REPEAT_NGRAM) -> int:
    """How often the most frequent n-gram of `tokens` occurs (0 with fewer than n)."""
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return max(grams.values(), default=0)


def longest_run(tokens: list[str]) -> int:
    """The longest run of one token repeated back to back (0 for no tokens)."""
    best = run = 0
    for i, tok in enumerate(tokens):
        run = run + 1 if i and tok == tokens[i - 1] else 1
        best = max(best, run)
    return best


def foreign_share(text: str) -> float:
    """The share of `text`'s non-space characters outside printable ASCII, common math
    symbols and typographic punctuation (0 for a text of spaces only)."""
    chars = [c for c in text if not c.isspace()]
    odd = sum(1 for c in chars if not (" " <= c <= "~" or c in ALLOWED_NON_ASCII))
    return odd / len(chars) if chars else 0.0


GARBLE_KINDS = ("no_number", "repeat", "foreign")


def malformations(text: str, ended: bool) -> tuple[str, ...]:
    """The garble kinds of a response `text` (cut at its first stop string; `ended`: one
    was there), in the module docstring's order; empty for a well-formed response."""
    if not ended and text.endswith("\ufffd"):
        text = text[:-1]  # half of a multi-byte character, cut by the token limit
    tokens = garble_tokens(text)
    kinds = []
    if not numbers(text):
        kinds.append("no_number")
    if longest_ngram_count(tokens) >= REPEAT_NGRAM_COUNT or longest_run(tokens) >= REPEAT_RUN:
        kinds.append("repeat")
    if foreign_share(text) > FOREIGN_SHARE:
        kinds.append("foreign")
    return tuple(kinds)


class ArithmeticQATask(Task):
    garble_kinds = GARBLE_KINDS
    name = "arithmetic_qa"
    chat_default = True
    config_class = ArithmeticQAConfig

    def __init__(self, config: ArithmeticQAConfig | None = None, **overrides):
        if config is not None and overrides:
            raise TypeError("ArithmeticQATask: pass a config or keyword overrides, not both")
        self.config = config if config is not None else ArithmeticQAConfig(**overrides)
        self.template = self.config.template
        self._samples: dict[str, list[Sample]] | None = None

    def samples(self, split: str) -> list[Sample]:
        check_split(split)
        if self._samples is None:
            self._samples = {
                name: [self._sample(p, name, i) for i, p in enumerate(problems)]
                for name, problems in split_problems(self.config).items()
            }
        return list(self._samples[split])

    def _sample(self, problem: Problem, split: str, index: int) -> Sample:
        a, op, b = problem
        question = question_text(problem)
        return Sample(
            prompt=self.format_prompt(question),
            answer=str(evaluate([a, b], [op])),
            question=question,
            meta={"split": split, "index": index, "pair": (min(a, b), max(a, b)), "op": op},
        )

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        text = cut_at_stops(response_text, self.config.stop_strings)
        ended = len(text) < len(response_text)
        extracted = extract_answer(text, self.config.answer_fallback)
        value = answer_value(extracted)
        correct = value is not None and value == Fraction(int(sample.answer))
        kinds = malformations(text, ended)
        info = {
            "parsed": value is not None,
            "correct": correct,
            "ended": ended,
            "extracted": extracted,
            "malformed": bool(kinds),
            "malformations": kinds,
        }
        return RewardResult(1.0 if correct else 0.0, info)
