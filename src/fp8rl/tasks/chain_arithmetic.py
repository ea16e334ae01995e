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

`steps_max` (None: every problem has `steps` operators) draws each problem's number of
operators uniformly from steps..steps_max, so the length of a response varies with its
problem and a policy's responses can drift in length and form.

`order` ("fixed": the question's order) is the form of the reference chains the warm start
learns from. "any" (ops "+" only) writes each problem's chain in an order drawn for it: the
operands are added in a random order and each step's two addends either way round, as in

    56+12=68 68+34=102 78+102=180 180+90=270 (270)<eos>

so a warm-started model spreads its probability over many valid chains of the same answer.
That is sampling entropy that costs no reward: on a fixed chain, the warm start's entropy
sits on the running totals only, and a model uncertain enough to sample 0.3 nats/token
almost never samples a right answer.

Malformed responses (info["malformed"], the garble rate `rollout/malformed_frac`): the
reward ignores the chain, the garble rate does not. `malformations(text, ended, steps)`
lists, in this order, what a response breaks:

- "unterminated": no <eos> (the response ran into max_new_tokens);
- "off_format": a character outside digits, "+-=() ", or text before the final "(N)"
  that is not single-space-separated "A+B=C" / "A-B=C" steps each followed by one space;
- "no_answer": no final "(N)" (`parsed` is False);
- "repeated": a step written twice, or more steps than the problem has operators (a
  chain that loops or runs on). A shorter chain, down to the bare "(N)", is allowed: RL
  may shorten it, and a wrong running total is an error, not a garble.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from fp8rl.errors import ConfigError

from .arithmetic import (
    ArithmeticConfig,
    ArithmeticTask,
    draw_problem,
    generate_problems,
    operand_range,
    problem_space_size,
)
from .base import RewardResult, Sample, is_int

# "*" is left out: with precedence a chain of running totals would no longer be one step per
# operator, and left-to-right totals would disagree with the arithmetic task's values.
CHAIN_OPS = "+-"
_TOKEN = re.compile(r"\d+|[+-]")
_FINAL = re.compile(r"[^()]*\((-?\d+)\)")
_STEP = re.compile(r"-?\d+[+-]\d+=-?\d+")
_FORMAT_CHARS = frozenset("0123456789+-=() ")
ORDERS = ("fixed", "any")


@dataclass(frozen=True)
class ChainArithmeticConfig:
    digits: int = 2
    ops: str = "+"
    steps: int = 4
    steps_max: int | None = None  # None: `steps` operators in every problem
    order: str = "fixed"  # the reference chains: "fixed" | "any" (module docstring)
    train_size: int = 4000
    test_size: int = 500
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.ops, str) and set(self.ops) - set(CHAIN_OPS):
            raise ConfigError(
                "ops", self.ops, f"a non-empty string of distinct characters from {CHAIN_OPS!r}"
            )
        if self.order not in ORDERS:
            raise ConfigError("order", self.order, f"one of {', '.join(map(repr, ORDERS))}")
        if self.order == "any" and self.ops != "+":
            # reordering a chain with "-" changes its running totals' signs and, written as
            # "A-B=C" steps, its value
            raise ConfigError("order", self.order, "'fixed' unless ops is '+'")
        if self.steps_max is None:
            # Every other check (and the problem-space bound) is the arithmetic task's.
            self.arithmetic_config()
            return
        # Sizes 0: the bound below counts the problems of every length, not of `steps` only.
        base = self.arithmetic_config(train_size=0, test_size=0)
        if not is_int(self.steps_max) or self.steps_max < self.steps:
            raise ConfigError(
                "steps_max", self.steps_max, f"None or an integer >= steps = {self.steps}"
            )
        space = sum(
            problem_space_size(ArithmeticConfig(base.digits, base.ops, k, 0, 0))
            for k in range(self.steps, self.steps_max + 1)
        )
        if self.train_size + self.test_size > space:
            raise ConfigError(
                "train_size + test_size",
                self.train_size + self.test_size,
                f"at most {space}, the number of distinct problems with digits={self.digits}, "
                f"ops={self.ops!r}, steps={self.steps}..{self.steps_max}",
            )

    @property
    def max_steps(self) -> int:
        return self.steps if self.steps_max is None else self.steps_max

    def arithmetic_config(self, **overrides) -> ArithmeticConfig:
        fields = dict(
            digits=self.digits,
            ops=self.ops,
            steps=self.steps,
            train_size=self.train_size,
            test_size=self.test_size,
            seed=self.seed,
        )
        return ArithmeticConfig(**{**fields, **overrides})


def scratchpad(question: str) -> tuple[str, int]:
    """The reference response (without <eos>) of a "+"/"-" question, and its value."""
    tokens = _TOKEN.findall(question)
    if "".join(tokens) != question or len(tokens) % 2 == 0 or not tokens[0].isdigit():
        raise ValueError(f"scratchpad: {question!r} is not a chain of '+'/'-' operations")
    total, lines = int(tokens[0]), []
    for op, x in zip(tokens[1::2], tokens[2::2], strict=True):
        new = total + int(x) if op == "+" else total - int(x)
        lines.append(f"{total}{op}{x}={new}")
        total = new
    return " ".join(lines) + f" ({total})", total


def any_order_scratchpad(question: str, rng: random.Random) -> tuple[str, int]:
    """A reference response (without <eos>) of a "+" question that adds its operands in an
    order drawn from `rng`, each step's addends either way round, and its value."""
    tokens = _TOKEN.findall(question)
    if "".join(tokens) != question or set(tokens[1::2]) - {"+"} or len(tokens) % 2 == 0:
        raise ValueError(f"any_order_scratchpad: {question!r} is not a chain of '+' operations")
    operands = [int(x) for x in tokens[::2]]
    rng.shuffle(operands)
    total, lines = operands[0], []
    for x in operands[1:]:
        a, b = (total, x) if rng.random() < 0.5 else (x, total)
        lines.append(f"{a}+{b}={total + x}")
        total += x
    return " ".join(lines) + f" ({total})", total


def parse_final_answer(text: str) -> str | None:
    """The N of a response that ends in "(N)" and holds no other parenthesis, else None."""
    m = _FINAL.fullmatch(text)
    return m.group(1) if m else None


def malformations(text: str, ended: bool, steps: int) -> tuple[str, ...]:
    """What the response `text` (cut at its first <eos>; `ended`: one was there) breaks of
    the format of a problem with `steps` operators (the kinds in the module docstring)."""
    kinds = [] if ended else ["unterminated"]
    parsed = parse_final_answer(text) is not None
    # The steps are the pieces followed by a space: before the final "(N)" all of them must
    # be steps; without an answer the last piece may be cut off, so only the others count.
    chain = text[: text.rfind("(")] if parsed else text
    pieces = chain.split(" ")[:-1]
    off = set(text) - _FORMAT_CHARS or (
        parsed and (chain.split(" ")[-1] or not all(_STEP.fullmatch(p) for p in pieces))
    )
    if off:
        kinds.append("off_format")
    if not parsed:
        kinds.append("no_answer")
    if len(pieces) > steps or len(set(pieces)) < len(pieces):
        kinds.append("repeated")
    return tuple(kinds)


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
        steps = c.max_steps
        # |running total| <= (steps + 1) * hi; a minus sign when "-" can make it negative.
        total = len(str((steps + 1) * hi)) + ("-" in c.ops)
        per_step = total + 1 + c.digits + 1 + total + 1  # "A+B=C "
        return steps * per_step + total + 2 + 1

    def _problems(self) -> dict[str, list[tuple[str, int]]]:
        c = self.config
        if c.max_steps == c.steps:  # steps_max = steps draws no lengths: the fixed problems
            return generate_problems(c.arithmetic_config())

        def draw(rng):
            # The length first, from the same stream, so the problems stay a pure function
            # of the config.
            return draw_problem(rng, c.digits, c.ops, rng.randint(c.steps, c.steps_max))

        return generate_problems(c, draw=draw)  # c: the sizes and the seed

    def _meta(self, question: str) -> dict:
        if self.config.order == "fixed":
            return {"solution": scratchpad(question)[0]}
        # a stream per question: a problem's chain does not depend on the split's other ones
        rng = random.Random(f"fp8rl/chain_arithmetic/{self.config.seed}/order/{question}")
        return {"solution": any_order_scratchpad(question, rng)[0]}

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        text, ended = self._until_stop(response_text)
        extracted = parse_final_answer(text)
        correct = extracted is not None and extracted == sample.answer
        kinds = malformations(text, ended, len(_TOKEN.findall(sample.question)) // 2)
        info = {
            "parsed": extracted is not None,
            "correct": correct,
            "ended": ended,
            "extracted": extracted,
            "malformed": bool(kinds),
            "malformations": kinds,
        }
        return RewardResult(1.0 if correct else 0.0, info)

    # Supervised warm start -------------------------------------------------------------
    def sft_examples(self, split: str = "train") -> list[tuple[str, str]]:
        """(prompt, reference response) pairs; the trainer appends <eos> (fp8rl.train.warmstart)."""
        return [(s.prompt, s.meta["solution"]) for s in self.samples(split)]
