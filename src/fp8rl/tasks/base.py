"""The Task interface: prompts with gold answers, and a verifiable reward for a response."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fp8rl.errors import ConfigError

SPLITS = ("train", "test")
# End-of-sequence and padding markers of common tokenizers: a response is read up to the
# first of them, so decoding with special tokens gives the same reward.
STOP_STRINGS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>", "<eos>", "<pad>")


@dataclass(frozen=True)
class Sample:
    """One problem. `prompt` is the exact text given to the model (template applied);
    `prompt_ids`, when set, its token ids, which the rollout then takes as they are (a chat
    prompt is tokenized once, without a second BOS: tasks.chat)."""

    prompt: str
    answer: str
    question: str = ""
    # Provenance (file and row, split and index); treat as read-only.
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    prompt_ids: tuple[int, ...] | None = None


def prompt_inputs(samples: Sequence[Sample]) -> list:
    """What a rollout engine's `generate` takes for these samples: their token ids when they
    carry them, else their prompt texts."""
    with_ids = [s.prompt_ids is not None for s in samples]
    if all(with_ids):
        return [list(s.prompt_ids) for s in samples]
    if any(with_ids):
        raise ValueError("prompt_inputs: some samples carry prompt_ids and some do not")
    return [s.prompt for s in samples]


@dataclass(frozen=True)
class RewardResult:
    score: float
    # Always holds "parsed" (an answer could be read) and "correct" (bool). May hold
    # "malformed" (bool: the response breaks the task's format); without it a response is
    # malformed when it is not parsed (tasks.scoring.score_batch). May hold "malformations":
    # the kinds of garbling it shows, out of its task's `garble_kinds`.
    info: dict = field(default_factory=dict, compare=False, hash=False)


class Task(ABC):
    """A verifiable task: `samples(split)` to prompt the policy, `reward` to score a response.

    `response_text` is the decoded completion only (no prompt). Text after an end-of-sequence
    token is never read, so decoding with or without special tokens gives the same reward.
    """

    name: str = ""
    # task.chat: null renders this task's prompts with the model's chat template
    chat_default: bool = False
    # "{question}" is replaced by the question; other braces are literal (e.g. \boxed{}).
    template: str = "{question}"
    # the kinds info["malformations"] may list; each kind's share of a step's responses is
    # logged beside the garble rate (rollout/malformed_frac/KIND)
    garble_kinds: tuple[str, ...] = ()

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


def check_stop_strings(stops) -> tuple[str, ...]:
    if isinstance(stops, str) or not all(isinstance(x, str) and x for x in stops):
        raise ConfigError("stop_strings", stops, "a list of non-empty strings")
    return tuple(stops)


def check_fallback(fallback) -> str:
    from .answer_extraction import FALLBACKS

    if fallback not in FALLBACKS:
        raise ConfigError("answer_fallback", fallback, " or ".join(repr(f) for f in FALLBACKS))
    return fallback


def cut_at_stops(text: str, stops) -> str:
    """`text` up to the first of the `stops` strings it holds."""
    for stop in stops:
        cut = text.find(stop)
        if cut >= 0:
            text = text[:cut]
    return text
