"""Find the final answer in a free-form math response (pure string work, no math-verify).

Rules, in order:
1. The last complete `\\boxed{...}` or `\\fbox{...}` (braces balanced, `\\{` `\\}` escaped),
   or `\\boxed 5` without braces. An unclosed box (a truncated response) is skipped.
2. Otherwise the last "answer is X" / "Answer: X" / "answer = X" phrase (any case, so
   "The final answer is", "**Answer:**" too): X runs to the end of its line (or is the next
   non-empty line when the phrase ends its line), is cut at the first full stop followed by
   a space, and is stripped of markdown stars, $...$, \\(...\\), \\[...\\] and trailing
   punctuation.
3. Otherwise, with `fallback="last_number"`, the last number in the text (`last_number`);
   with `fallback="none"` (the default) there is no answer (None). The fallback suits short
   chat answers ("7 + 5 = 12."), not long derivations: it rewards responses that never
   commit to an answer, whose last number is often an intermediate result.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_PHRASE = re.compile(
    r"\banswer[ \t]*(?:is\b[ \t]*:?|:|=)[ \t*:]*(?P<rest>[^\n]*)", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"\.(?=\s)")
FALLBACKS = ("none", "last_number")
# A number: an optional sign, digits with optional comma thousands groups ("1,000"), an
# optional decimal part. A sign counts only where it cannot be a binary minus ("5-3" holds 5
# and 3, not -3): not after a letter, digit or closing bracket.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-\u2212])?(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?!\d)(?:\.\d+)?"
)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


# One left-to-right pass over the brace tokens: an escape pair (backslash and the character
# after it) never opens or closes a group. Linear in the text, whatever it contains.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
_BARE_ARG = re.compile(r"[^\s$]+")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each "{" that is closed -> index of the "}" that closes it."""
    closes: dict[int, int] = {}
    open_at: list[int] = []
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            open_at.append(m.start())
        elif tok == "}" and open_at:
            closes[open_at.pop()] = m.start()
    return closes


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the argument of every complete \\boxed / \\fbox, in order."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    closes = _closing_braces(text)
    spans = []
    for m in _BOX.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            if i in closes:
                spans.append((i + 1, closes[i]))
        elif i > m.end():
            # "\boxed 5": the argument is the next run of non-space, non-$ characters.
            arg = _BARE_ARG.match(text, i)
            if arg:
                spans.append((i, arg.end()))
    return spans


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete \\boxed / \\fbox in order of appearance."""
    return [text[a:b].strip() for a, b in _box_spans(text)]


def _last_box(text: str) -> str | None:
    # Only the last box is sliced: slicing every box of deeply nested ones would be quadratic.
    spans = _box_spans(text)
    return text[spans[-1][0] : spans[-1][1]].strip() if spans else None


_WRAP_CHARS = frozenset("*")
_TRAIL_PUNCT = frozenset(".,;!")


def _strip_wrappers(ans: str) -> str:
    """Strip stars, trailing punctuation and $...$-style delimiters, outside in.

    Works on indices and slices once at the end, so a long run of wrappers stays linear.
    """
    lo, hi = 0, len(ans)
    while True:
        before = (lo, hi)
        # ans.strip().strip("*").rstrip(".,;!").strip(), on indices.
        for chars in (None, _WRAP_CHARS):
            while lo < hi and (ans[lo].isspace() if chars is None else ans[lo] in chars):
                lo += 1
            while lo < hi and (ans[hi - 1].isspace() if chars is None else ans[hi - 1] in chars):
                hi -= 1
        while lo < hi and ans[hi - 1] in _TRAIL_PUNCT:
            hi -= 1
        while lo < hi and ans[lo].isspace():
            lo += 1
        while lo < hi and ans[hi - 1].isspace():
            hi -= 1
        for left, right in _DELIMITERS:
            if (
                hi - lo > len(left) + len(right)
                and ans.startswith(left, lo, hi)
                and ans.endswith(right, lo, hi)
            ):
                lo, hi = lo + len(left), hi - len(right)
                break
        if (lo, hi) == before:
            return ans[lo:hi]


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


def numbers(text: str) -> list[str]:
    """Every number in `text` in order, normalized: commas dropped, a Unicode minus as "-"."""
    return [m.group().replace(",", "").replace("\u2212", "-") for m in _NUMBER.finditer(text)]


def last_number(text: str) -> str | None:
    """The last number in `text` ("12" of "7 + 5 = 12."), or None when it holds none."""
    found = numbers(text)
    return found[-1] if found else None


def extract_answer(text: str, fallback: str = "none") -> str | None:
    """The final answer string of a response, or None when it states none.

    `fallback`: "none", or "last_number" to read the last number when there is no box and
    no answer phrase (rule 3 of the module docstring).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"extract_answer: fallback = {fallback!r} must be one of {FALLBACKS}")
    box = _last_box(text)
    if box is not None:
        return box or None
    phrase = phrase_answer(text)
    if phrase is not None or fallback == "none":
        return phrase
    return last_number(text)
