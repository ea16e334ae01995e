"""The Task interface: prompts with gold answers, and a verifiable reward for a response."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fp8rl.errors import ConfigError

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Sample:
    """One problem. `prompt` is the exact text given to the model (template applied)."""

    prompt: str
    answer: str
    question: str = ""
    # Provenance (file and row, split and index); treat as read-only.
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class RewardResult:
    score: float
    # Always holds "parsed" (an answer could be read) and "correct" (bool). May hold
    # "malformed" (bool: the response breaks the task's format); without it a response is
    # malformed when it is not parsed (tasks.scoring.score_batch).
    info: dict = field(default_factory=dict, compare=False, hash=False)


class Task(ABC):
    """A verifiable task: `samples(split)` to prompt the policy, `reward` to score a response.

    `response_text` is the decoded completion only (no prompt). Text after an end-of-sequence
    token is never read, so decoding with or without special tokens gives the same reward.
    """

    name: str = ""
    # "{question}" is replaced by the question; other braces are literal (e.g. \boxed{}).
    template: str = "{question}"

    @property
    def tokenizer(self):
        """The task's own tokenizer, or None to use the checkpoint's."""
        return None

    @abstractmethod
    def samples(self, split: str) -> list[Sample]: ...

    @abstractmethod
    def reward(self, response_text: str, sample: Sample) -> RewardResult: ...

    def rewards(self, responses: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
        """Score responses[i] against samples[i]."""
        if len(responses) != len(samples):
            raise ValueError(f"rewards: {len(responses)} responses for {len(samples)} samples")
        return [self.reward(r, s) for r, s in zip(responses, samples, strict=True)]

    def format_prompt(self, question: str) -> str:
        return self.template.replace("{question}", question)


def is_int(value) -> bool:
    """An integer, not a bool: YAML 1.1 reads an unquoted yes/on as true, which is 1 to
    isinstance(value, int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError("split", split, " or ".join(repr(s) for s in SPLITS))
    return split


def check_template(template, key: str = "template") -> str:
    if not isinstance(template, str) or "{question}" not in template:
        raise ConfigError(key, template, "a template containing {question}")
    return template
