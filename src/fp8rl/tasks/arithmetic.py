"""Synthetic integer arithmetic: the embedded task the CPU demo learns in minutes.

A problem is "12+34" (operands with exactly `digits` digits, `steps` operators drawn from
`ops`), the prompt is "12+34=" and the target is "46" then <eos>. The value follows the usual
precedence ("*" before "+" and "-", left to right). The reward is exact: the response up to
its first <eos> must equal the answer character for character.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from fp8rl.errors import ConfigError

from .base import RewardResult, Sample, Task, check_split, is_int
from .char_tokenizer import char_tokenizer
from .sft import encode_pairs

OPS = "+-*"
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ArithmeticConfig:
    digits: int = 2
    ops: str = "+"
    steps: int = 1
    train_size: int = 4000
    test_size: int = 500
    seed: int = 0

    def __post_init__(self):
        if not is_int(self.digits) or not 1 <= self.digits <= 9:
            raise ConfigError("digits", self.digits, "an integer in 1..9")
        if (
            not isinstance(self.ops, str)
            or not self.ops
            or set(self.ops) - set(OPS)
            or len(set(self.ops)) != len(self.ops)
        ):
            raise ConfigError(
                "ops", self.ops, f"a non-empty string of distinct characters from {OPS!r}"
            )
        if not is_int(self.steps) or self.steps < 1:
            raise ConfigError("steps", self.steps, "an integer >= 1")
        for key in ("train_size", "test_size"):
            value = getattr(self, key)
            if not is_int(value) or value < 0:
                raise ConfigError(key, value, "an integer >= 0")
        if not is_int(self.seed):
            raise ConfigError("seed", self.seed, "an integer")
        space = problem_space_size(self)
        if self.train_size + self.test_size > space:
            raise ConfigError(
                "train_size + test_size",
                self.train_size + self.test_size,
                f"at most {space}, the number of distinct problems with digits={self.digits}, "
                f"ops={self.ops!r}, steps={self.steps}",
            )


def operand_range(digits: int) -> tuple[int, int]:
    """Operands have exactly `digits` digits (0-9 for one digit)."""
    return (0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def problem_space_size(cfg: ArithmeticConfig) -> int:
    lo, hi = operand_range(cfg.digits)
    return (hi - lo + 1) ** (cfg.steps + 1) * len(cfg.ops) ** cfg.steps


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Value with "*" binding tighter than "+"/"-", each level left to right."""
    if len(operands) != len(ops) + 1:
        raise ValueError(f"evaluate: {len(operands)} operands for {len(ops)} operators")
    terms, signs = [operands[0]], []
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        elif op in "+-":
            signs.append(op)
            terms.append(x)
        else:
            raise ValueError(f"evaluate: unknown operator {op!r}")
    total = terms[0]
    for op, t in zip(signs, terms[1:], strict=True):
        total = total + t if op == "+" else total - t
    return total


def draw_problem(rng: random.Random, digits: int, ops: str, steps: int) -> tuple[str, int]:
    """One random (question, value) with `steps` operators drawn from `ops`."""
    lo, hi = operand_range(digits)
    operands = [rng.randint(lo, hi) for _ in range(steps + 1)]
    chosen = [rng.choice(ops) for _ in range(steps)]
    question = str(operands[0]) + "".join(
        op + str(x) for op, x in zip(chosen, operands[1:], strict=True)
    )
    return question, evaluate(operands, chosen)


def generate_problems(cfg: ArithmeticConfig, draw=None) -> dict[str, list[tuple[str, int]]]:
    """Distinct (question, value) pairs per split, a pure function of the config.

    The test split is drawn first from its own stream, so it does not change with train_size;
    train then skips every test question, so the splits are disjoint. `draw(rng)` replaces
    the config's own draw (chain_arithmetic's variable number of steps); `cfg` then only
    gives the sizes and the seed.
    """
    if draw is None:

        def draw(rng):
            return draw_problem(rng, cfg.digits, cfg.ops, cfg.steps)

    splits: dict[str, list[tuple[str, int]]] = {}
    seen: set[str] = set()
    for split, size in (("test", cfg.test_size), ("train", cfg.train_size)):
        # A str seed is hashed with SHA-512, so streams are stable across runs and platforms.
        rng = random.Random(f"fp8rl/arithmetic/{cfg.seed}/{split}")
        problems = []
        while len(problems) < size:
            question, value = draw(rng)
            if question not in seen:
                seen.add(question)
                problems.append((question, value))
        splits[split] = problems
    return splits


class ArithmeticTask(Task):
    name = "arithmetic"
    template = "{question}="
    config_class = ArithmeticConfig

    def __init__(self, config=None, **overrides):
        if config is not None and overrides:
            raise TypeError(f"{type(self).__name__}: pass a config or keyword overrides, not both")
        self.config = config if config is not None else self.config_class(**overrides)
        self._samples: dict[str, list[Sample]] | None = None

    @cached_property
    def tokenizer(self):
        return char_tokenizer()

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def max_new_tokens(self) -> int:
        """Enough generated tokens for any answer of this config plus its <eos>."""
        lo, hi = operand_range(self.config.digits)
        # |value| <= sum over "*"-groups of hi**size <= their product hi**(steps+1),
        # as a + b <= a * b for a, b >= 2 (hi >= 9).
        widest = len(str(hi ** (self.config.steps + 1)))
        return widest + ("-" in self.config.ops) + 1

    def samples(self, split: str) -> list[Sample]:
        check_split(split)
        if self._samples is None:
            problems = self._problems()
            self._samples = {
                name: [
                    Sample(
                        prompt=self.format_prompt(q),
                        answer=str(v),
                        question=q,
                        meta={"split": name, "index": i, **self._meta(q)},
                    )
                    for i, (q, v) in enumerate(rows)
                ]
                for name, rows in problems.items()
            }
        return list(self._samples[split])

    def _problems(self) -> dict[str, list[tuple[str, int]]]:
        """The (question, value) pairs of each split."""
        return generate_problems(self.config)

    def _meta(self, question: str) -> dict:
        """What a task built on these problems adds to a sample's meta."""
        return {}

    def _until_stop(self, response_text: str) -> tuple[str, bool]:
        """The response up to its first <eos> or padding token, and whether one was there."""
        text, ended = response_text, False
        for stop in (self.tokenizer.eos_token, self.tokenizer.pad_token):
            cut = text.find(stop)
            if cut >= 0:
                text, ended = text[:cut], True
        return text, ended

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        text, ended = self._until_stop(response_text)
        correct = text == sample.answer
        info = {"parsed": _INTEGER.fullmatch(text) is not None, "correct": correct, "ended": ended}
        return RewardResult(1.0 if correct else 0.0, info)

    # Supervised warm-start -------------------------------------------------------------
    def sft_examples(self, split: str = "train") -> list[tuple[str, str]]:
        """(prompt, target) pairs such as ("12+34=", "46"); the trainer appends <eos>, as for
        prompt-completion data in general (fp8rl.train.warmstart does)."""
        return [(s.prompt, s.answer) for s in self.samples(split)]

    def sft_texts(self, split: str = "train") -> list[str]:
        """Full sequences "12+34=46<eos>" for plain language-model training."""
        eos = self.tokenizer.eos_token
        return [p + t + eos for p, t in self.sft_examples(split)]

    def encode_sft(self, split: str = "train") -> dict:
        """Right-padded tensors for supervised training: input_ids, attention_mask, labels.

        labels are -100 on <bos>, the prompt and the padding, so the loss covers the answer
        and its <eos> only (transformers' causal LM loss shifts labels itself).
        """
        ids, att, lab = encode_pairs(self.tokenizer, self.sft_examples(split))
        return {"input_ids": ids, "attention_mask": att, "labels": lab}
