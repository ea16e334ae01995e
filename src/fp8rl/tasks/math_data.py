"""Read math problem files (JSONL, JSON, Parquet) into (question, answer, is_chat) rows.

Row shapes accepted, the keys tried in order unless configured:
- question: "problem" (MATH, DeepScaleR), "prompt", "question" (GSM8K). A chat message list
  (DAPO-Math-17k's `prompt`) gives the content of its last "user" message.
- answer: "answer", "ground_truth", "reward_model.ground_truth" (DAPO-Math-17k, verl),
  "solution" (a worked solution: its last \\boxed{} is the answer). A GSM8K answer "... ####
  72" gives "72".
Dotted keys reach into nested objects. Row numbers in errors: JSONL "line N" counts lines
from 1 as editors do; JSON arrays and Parquet "row N" count from 0 as pandas and pyarrow do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8rl.errors import DataError

from .answer_extraction import boxed_answers

PROMPT_KEYS = ("problem", "prompt", "question")
ANSWER_KEYS = ("answer", "ground_truth", "reward_model.ground_truth", "solution")
_MISSING = object()
# Text read with errors="surrogateescape" keeps a non-UTF-8 byte as one of these code points,
# so the line (and column) of a bad byte can be named without changing how lines split.
_BAD_BYTE = re.compile("[\udc80-\udcff]")


def _check_utf8(text: str, where: str) -> None:
    bad = _BAD_BYTE.search(text)
    if bad:
        byte = ord(bad.group()) - 0xDC00
        raise DataError(f"{where}: not UTF-8 text (byte 0x{byte:02x} at column {bad.start() + 1})")


@dataclass(frozen=True)
class MathRow:
    question: str
    answer: str
    is_chat: bool  # the question came from a chat message list (already an instruction)
    source: str
    row: str  # "line 3" or "row 2"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _get(row: dict, key: str):
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _records(path: Path):
    """Yield (where, record) for each row of a file."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8", errors="surrogateescape") as f:
            for n, line in enumerate(f, start=1):
                _check_utf8(line, f"{path}: line {n}")
                if not line.strip():
                    continue
                try:
                    yield f"line {n}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{path}: line {n}: invalid JSON ({e.msg} at column {e.colno})"
                    ) from e
    elif suffix == ".json":
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        for n, line in enumerate(text.split("\n"), start=1):
            _check_utf8(line, f"{path}: line {n}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
            ) from e
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON array of rows, found {type(data).__name__}")
        for n, record in enumerate(data):
            yield f"row {n}", record
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DataError(
                f"{path}: reading Parquet needs pyarrow: pip install 'fp8rl[parquet]'"
            ) from e
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
            raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from e
        for n, record in enumerate(table.to_pylist()):
            yield f"row {n}", record
    else:
        raise DataError(
            f"{path}: unknown file type {suffix!r} (expected .jsonl, .json or .parquet)"
        )


def _question(record: dict, key: str | None, where: str) -> tuple[str, bool]:
    keys = (key,) if key else PROMPT_KEYS
    for k in keys:
        value = _get(record, k)
        if value is _MISSING:
            continue
        if isinstance(value, str):
            if not value.strip():
                raise DataError(f"{where}: field {k!r} is empty")
            return value, False
        if isinstance(value, list):
            return _chat_question(value, k, where), True
        raise DataError(
            f"{where}: field {k!r} must be text or a chat message list, found {_short(value)}"
        )
    raise DataError(
        f"{where}: no question field (looked for {', '.join(map(repr, keys))}; "
        f"row has keys {sorted(record)})"
    )


def _chat_question(messages: list, key: str, where: str) -> str:
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if (
        not users
        or not isinstance(users[-1].get("content"), str)
        or not users[-1]["content"].strip()
    ):
        raise DataError(
            f"{where}: field {key!r} is a message list without a user message with text "
            f"content: {_short(messages)}"
        )
    return users[-1]["content"]


def _answer(record: dict, key: str | None, where: str) -> str:
    keys = (key,) if key else ANSWER_KEYS
    for k in keys:
        value = _get(record, k)
        if value is _MISSING or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise DataError(f"{where}: field {k!r} must be text or a number, found {_short(value)}")
        # JSON's NaN/Infinity literals (and Parquet floats) parse to floats no answer equals
        nan_text = isinstance(value, str) and value.strip().lower() == "nan"
        if (isinstance(value, float) and not math.isfinite(value)) or nan_text:
            raise DataError(
                f"{where}: field {k!r} is {value!r}: a gold answer must be a finite number or text"
            )
        text = str(value)
        if "####" in text:
            text = text.rsplit("####", 1)[1]
        elif k.split(".")[-1] == "solution":
            boxes = boxed_answers(text)
            if not boxes:
                raise DataError(
                    f"{where}: field {k!r} is a solution without a \\boxed{{}} answer: "
                    f"{_short(text)}"
                )
            text = boxes[-1]
        text = text.strip()
        if not text:
            raise DataError(f"{where}: field {k!r} is empty")
        return text
    raise DataError(
        f"{where}: no answer field (looked for {', '.join(map(repr, keys))}; "
        f"row has keys {sorted(record)})"
    )


def read_math_rows(
    path, *, prompt_key: str | None = None, answer_key: str | None = None
) -> list[MathRow]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = []
    for where, record in _records(path):
        at = f"{path}: {where}"
        if not isinstance(record, dict):
            raise DataError(f"{at}: expected an object, found {_short(record)}")
        question, is_chat = _question(record, prompt_key, at)
        rows.append(MathRow(question, _answer(record, answer_key, at), is_chat, str(path), where))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows
