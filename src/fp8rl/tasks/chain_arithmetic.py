"""Long-answer arithmetic: the model writes a chain of running totals before its answer.

A problem is "12+34+56+78+90" (the arithmetic task's problems, operators "+" and "-" only),
the prompt is "12+34+56+78+90=" and the reference response is one step per operator, then
the final answer in parentheses:

    12+34=46 46+56=102 102+78=180 180+90=270 (270)<eos>

The defaults give 40-48 characters (one token each with the character tokenizer), long
enough that a response can degrade into garbled text, which the 2-4 token answers of
`arithmetic` cannot. The reward reads the final answer only: the response up to its first
<eos> must end in "(N)" with no other parenthesis in it, and N must equal the value
character for character. The chain is not graded, so RL may shorten or rewrite it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fp8rl.errors import ConfigError

from .arithmetic import ArithmeticConfig, ArithmeticTask, operand_range
from .base import RewardResult, Sample

# "*" is left out: with precedence a chain of running totals would no longer be one step per
# operator, and left-to-right totals would disagree with the arithmetic task's values.
CHAIN_OPS = "+-"
_TOKEN = re.compile(r"\d+|[+-]")
_FINAL = re.compile(r"[^()]*\((-?\d+)\)")


@dataclass(frozen=True)
class ChainArithmeticConfig:
    digits: int = 2
    ops: str = "+"
    steps: int = 4
    train_size: int = 4000
    test_size: int = 500
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.ops, str) and set(self.ops) - set(CHAIN_OPS):
            raise ConfigError(
                "ops", self.ops, f"a non-empty string of distinct characters from {CHAIN_OPS!r}"
            )
        # Every other check (and the problem-space bound) is the arithmetic task's.
        self.arithmetic_config()

    def arithmetic_config(self) -> ArithmeticConfig:
        return ArithmeticConfig(
            digits=self.digits,
            ops=self.ops,
            steps=self.steps,
            train_size=self.train_size,
            test_size=self.test_size,
            seed=self.seed,
        )


def scratchpad(question: str) -> tuple[str, int]:
    """The reference response (without <eos>) of a "+"/"-" question, and its value."""
    tokens = _TOKEN.findall(question)
    if "".join(tokens) != question or len(tokens) % 2 == 0 or not tokens[0].isdigit():
        raise ValueError(f"scratchpad: {question!r} is not a chain of '+'/'-' operations")
    total, lines = int(tokens[0]), []
    for op, x in zip(tokens[1::2], tokens[2::2]):
        new = total + int(x) if op == "+" else total - int(x)
        lines.append(f"{total}{op}{x}={new}")
        total = new
    return " ".join(lines) + f" ({total})", total


def parse_final_answer(text: str) -> str | None:
    """The N of a response that ends in "(N)" and holds no other parenthesis, else None."""
    m = _FINAL.fullmatch(text)
    return m.group(1) if m else None


class ChainArithmeticTask(ArithmeticTask):
    """The arithmetic task's problems, alphabet and tokenizer (so a model of either task can
    continue on the other), with a chain of running totals as the response."""

    name = "chain_arithmetic"
    config_class = ChainArithmeticConfig

    @property
    def max_new_tokens(self) -> int:
        """Enough generated tokens for any reference response of this config plus its <eos>."""
        c = self.config
        _, hi = operand_range(c.digits)
        # |running total| <= (steps + 1) * hi; a minus sign when "-" can make it negative.
        total = len(str((c.steps + 1) * hi)) + ("-" in c.ops)
        per_step = total + 1 + c.digits + 1 + total + 1  # "A+B=C "
        return c.steps * per_step + total + 2 + 1

    def _problem_config(self) -> ArithmeticConfig:
        return self.config.arithmetic_config()

    def _meta(self, question: str) -> dict:
        return {"solution": scratchpad(question)[0]}

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        text, ended = self._until_stop(response_text)
        extracted = parse_final_answer(text)
        correct = extracted is not None and extracted == sample.answer
        info = {
            "parsed": extracted is not None,
            "correct": correct,
            "ended": ended,
            "extracted": extracted,
        }
        return RewardResult(1.0 if correct else 0.0, info)

    # Supervised warm start -------------------------------------------------------------
    def sft_examples(self, split: str = "train") -> list[tuple[str, str]]:
        """(prompt, reference response) pairs; the trainer appends <eos> (fp8rl.train.sft)."""
        return [(s.prompt, s.meta["solution"]) for s in self.samples(split)]
