"""RLVR on math word problems (DeepScaleR, DAPO-Math-17k, MATH, GSM8K files on disk).

The reward is 1.0 when the response's final answer (see answer_extraction) is equivalent to
the gold answer according to math-verify, else 0.0. A response without a readable answer
scores 0 with info["parsed"] False; nothing a response contains raises.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fp8rl.errors import ConfigError

from .answer_extraction import extract_answer
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
from .grading import Grade, GraderPool, grade_many
from .math_data import read_math_rows

DEFAULT_TEMPLATE = (
    "{question} Let's think step by step and output the final answer within \\boxed{}."
)
FIXTURE_PATH = Path(__file__).resolve().parent.parent / "data" / "math_fixture.jsonl"

Files = str | Path | Sequence[str | Path] | None


@dataclass(frozen=True)
class MathConfig:
    train_path: Files = None  # one path or a list of paths
    test_path: Files = None
    # None tries "problem", "prompt", "question" in that order.
    prompt_key: str | None = None
    # None tries "answer", "ground_truth", "reward_model.ground_truth", "solution".
    answer_key: str | None = None
    # None: DEFAULT_TEMPLATE for plain-text questions, the question as is for chat-shaped
    # rows (DAPO-Math-17k writes its own instructions into the message).
    template: str | None = None
    timeout_s: int = 5  # math-verify's limit per parse and per comparison
    # Processes grading a batch in `rewards`; 0 grades inline in the main thread.
    workers: int = 0
    # A response is read up to the first of these (end-of-sequence and padding markers of
    # common tokenizers), so decoding with special tokens gives the same reward.
    stop_strings: tuple[str, ...] = STOP_STRINGS
    # "none" | "last_number": the last number of a response without \boxed{} or an
    # "answer is" phrase (answer_extraction, rule 3)
    answer_fallback: str = "none"

    def __post_init__(self):
        if self.template is not None:
            check_template(self.template)
        if not is_int(self.timeout_s) or self.timeout_s < 1:
            raise ConfigError(
                "timeout_s", self.timeout_s, "an integer >= 1 (math-verify counts whole seconds)"
            )
        if not is_int(self.workers) or self.workers < 0:
            raise ConfigError("workers", self.workers, "an integer >= 0")
        for key in ("prompt_key", "answer_key"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(key, value, "null or a column name (quote yes, no, on, off)")
        check_stop_strings(self.stop_strings)
        check_fallback(self.answer_fallback)


def _file_list(files: Files) -> list[Path]:
    if files is None:
        return []
    if isinstance(files, (str, Path)):
        return [Path(files)]
    return [Path(f) for f in files]


class MathTask(Task):
    name = "math"
    template = DEFAULT_TEMPLATE

    def __init__(self, config: MathConfig | None = None, **overrides):
        if config is not None and overrides:
            raise TypeError("MathTask: pass a config or keyword overrides, not both")
        self.config = config if config is not None else MathConfig(**overrides)
        if self.config.template is not None:
            self.template = self.config.template
        self._samples: dict[str, list[Sample]] = {}
        # Grading processes for calls from non-main threads, and for batches when workers > 0.
        self._pool = GraderPool(max(1, self.config.workers))

    def samples(self, split: str) -> list[Sample]:
        check_split(split)
        if split not in self._samples:
            files = _file_list(getattr(self.config, f"{split}_path"))
            if not files:
                raise ConfigError(
                    f"{split}_path", None, "one or more .jsonl, .json or .parquet files"
                )
            out = []
            for path in files:
                for row in read_math_rows(
                    path, prompt_key=self.config.prompt_key, answer_key=self.config.answer_key
                ):
                    verbatim = row.is_chat and self.config.template is None
                    out.append(
                        Sample(
                            prompt=row.question if verbatim else self.format_prompt(row.question),
                            answer=row.answer,
                            question=row.question,
                            meta={"source": row.source, "row": row.row},
                        )
                    )
            self._samples[split] = out
        return list(self._samples[split])

    def reward(self, response_text: str, sample: Sample) -> RewardResult:
        return self.rewards([response_text], [sample])[0]

    def rewards(self, responses: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
        if len(responses) != len(samples):
            raise ValueError(f"rewards: {len(responses)} responses for {len(samples)} samples")
        # A response's whole reward gets 3 x timeout_s: extraction (linear in the text)
        # spends from the same budget as math-verify's parses and comparisons.
        budget_s = 3 * self.config.timeout_s
        extracted, budgets = [], []
        for r in responses:
            t0 = time.monotonic()
            text = cut_at_stops(r, self.config.stop_strings)
            extracted.append(extract_answer(text, self.config.answer_fallback))
            budgets.append(budget_s - (time.monotonic() - t0))
        todo = [i for i, e in enumerate(extracted) if e is not None]
        grades = grade_many(
            [(samples[i].answer, extracted[i]) for i in todo],
            self.config.timeout_s,
            self._pool,
            use_pool=self.config.workers > 0 and len(todo) > 1,
            budgets=[budgets[i] for i in todo],
        )
        by_index: dict[int, Grade] = dict(zip(todo, grades, strict=True))
        results = []
        for i, answer in enumerate(extracted):
            g = by_index.get(i)
            if g is None:  # no answer stated: math-verify is not consulted
                g = Grade(gold_parsed=None, parsed=False, correct=False)
            info = {
                "parsed": g.parsed,
                "correct": g.correct,
                "extracted": answer,
                "gold_parsed": g.gold_parsed,  # None when not checked
                "timeout": g.timeout,
            }
            results.append(RewardResult(1.0 if g.correct else 0.0, info))
        return results

    def close(self) -> None:
        """Stop the grading processes, if any were started."""
        self._pool.close()
