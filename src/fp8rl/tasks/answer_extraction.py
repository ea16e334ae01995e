"""Find the final answer in a free-form math response (pure string work, no math-verify).

Rules, in order:
1. The last complete `\\boxed{...}` or `\\fbox{...}` (braces balanced, `\\{` `\\}` escaped),
   or `\\boxed 5` without braces. An unclosed box (a truncated response) is skipped.
2. Otherwise the last "answer is X" / "Answer: X" / "answer = X" phrase (any case, so
   "The final answer is", "**Answer:**" too): X runs to the end of its line (or is the next
   non-empty line when the phrase ends its line), is cut at the first full stop followed by
   a space, and is stripped of markdown stars, $...$, \\(...\\), \\[...\\] and trailing
   punctuation.
3. Otherwise there is no answer (None). There is deliberately no "last number in the text"
   fallback: it would reward responses that never commit to an answer.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_PHRASE = re.compile(
    r"\banswer[ \t]*(?:is\b[ \t]*:?|:|=)[ \t*:]*(?P<rest>[^\n]*)", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"\.(?=\s)")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the {...} group opening at text[start], and the index after it."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete \\boxed / \\fbox in order of appearance."""
    found = []
    for m in _BOX.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            group = _braced(text, i)
            if group is not None:
                found.append(group[0].strip())
        elif i > m.end():
            # "\boxed 5": the argument is the next run of non-space, non-$ characters.
            arg = re.match(r"[^\s$]+", text[i:])
            if arg:
                found.append(arg.group(0))
    return found


def _strip_wrappers(ans: str) -> str:
    while True:
        before = ans
        ans = ans.strip().strip("*").rstrip(".,;!").strip()
        for left, right in _DELIMITERS:
            if len(ans) > len(left) + len(right) and ans.startswith(left) and ans.endswith(right):
                ans = ans[len(left) : -len(right)]
                break
        if ans == before:
            return ans


def phrase_answer(text: str) -> str | None:
    """X of the last "answer is X" / "Answer: X" phrase, or None.

    When the phrase ends its line ("The answer is:" then a display line), X is the next
    non-empty line.
    """
    matches = list(_ANSWER_PHRASE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    rest = m.group("rest")
    if not rest.strip():
        following = [line for line in text[m.end() :].split("\n") if line.strip()]
        rest = following[0] if following else ""
    ans = _strip_wrappers(_SENTENCE_END.split(rest, maxsplit=1)[0])
    return ans or None


def extract_answer(text: str) -> str | None:
    """The final answer string of a response, or None when it states none."""
    boxes = boxed_answers(text)
    if boxes:
        return boxes[-1] or None
    return phrase_answer(text)
