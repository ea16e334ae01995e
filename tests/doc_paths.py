"""Repository paths that README.md and docs/*.md present as committed, and which of them git
does not track (tests/test_doc_paths.py): a document must never cite data that a fresh clone
lacks, as the long study once cited raw runs that `.gitignore` had kept out.

A citation is a link target, an inline code span that is one path, or a path-shaped word
of an inline command, when it names something under a tracked top-level folder or a tracked
top-level file (`fp8rl/...` is read as `src/fp8rl/...`). Not citations: the path after
`--out`, `-o` or `>` (what a documented command writes), anything under the ignored `runs/`,
and web addresses. A placeholder segment (`ARM`, `seed-S`, `*`, `<...>`, `{...}`) ends the
path: the folder before it must be tracked. A pre-registered document keeps the paths it was
written with: a note "`OLD` moved to `NEW`" in it makes its citations of OLD stand for NEW.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
OUTPUT_FLAGS = {"--out", "-o", ">", ">>"}
# a segment that stands for many: an upper-case name (ARM, N, PATH) alone or after a dash
# (seed-S), a glob, or an angle/brace template
PLACEHOLDER = re.compile(r"(^|-)[A-Z][A-Z0-9_]*$|[*?<>{}]")
PATH_CHARS = re.compile(r"^[\w./-]+$")
MOVED = re.compile(r"`([\w./-]+)` moved to `([\w./-]+)`")


@dataclass(frozen=True)
class Citation:
    doc: str
    line: int
    path: str  # repository-relative, placeholders cut off
    moved_to: str | None = None  # where a note of the document says the path has moved

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.path}"


def tracked_files(root: Path = ROOT) -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout
    return {p for p in out.decode().split("\0") if p}


def is_tracked(path: str, tracked: set[str]) -> bool:
    """A tracked file, or a folder holding one."""
    path = path.rstrip("/")
    return path in tracked or any(t.startswith(path + "/") for t in tracked)


def _doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _normalise(
    word: str, doc_dir: str, roots: set[str], relative: bool, packages: set[str]
) -> str | None:
    """The repository path a word cites, or None when it cites nothing of the repository."""
    word = word.strip().strip(".,;:()'\"").split("#", 1)[0]
    if not word or "://" in word or word.startswith(("mailto:", "$", "~", "/", "-")):
        return None
    if not PATH_CHARS.match(word.replace("*", "").replace("<", "").replace(">", "")):
        return None
    parts = [p for p in word.split("/") if p not in ("", ".")]
    if relative and doc_dir:
        parts = [*doc_dir.split("/"), *parts]
    resolved: list[str] = []
    for part in parts:
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
        else:
            resolved.append(part)
    if resolved[:1] == ["fp8rl"]:
        # a module path (fp8rl/study/x.py), not a metric name such as fp8rl/calib/lower
        if len(resolved) < 2 or resolved[1] not in packages:
            return None
        resolved = ["src", *resolved]
    if not resolved or resolved[0] not in roots or resolved[0] == "runs":
        return None
    cut = next((i for i, p in enumerate(resolved) if PLACEHOLDER.search(p)), len(resolved))
    if cut == 0:
        return None
    return "/".join(resolved[:cut])


def _span_words(span: str) -> list[str]:
    """The words of an inline code span that may cite a path: all of a one-word span, the
    arguments of a command except what follows an output flag."""
    words = span.split()
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in OUTPUT_FLAGS:
            skip = True
            continue
        if w.startswith("--out="):
            continue
        out.append(w)
    return out


def citations(root: Path = ROOT, tracked: set[str] | None = None) -> list[Citation]:
    tracked = tracked_files(root) if tracked is None else tracked
    roots = {t.split("/", 1)[0] for t in tracked}
    packages = {t.split("/")[2] for t in tracked if t.startswith("src/fp8rl/")}
    found = []
    for doc in _doc_files(root):
        rel_doc = doc.relative_to(root).as_posix()
        doc_dir = doc.parent.relative_to(root).as_posix().replace(".", "")
        text = doc.read_text()
        moves = {
            _normalise(old, doc_dir, roots, False, packages): new
            for old, new in MOVED.findall(text)
        }
        in_block = False
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            if in_block:  # command listings: what they read is cited again in the prose
                continue
            for target in LINK.findall(line):
                p = _normalise(target, doc_dir, roots, True, packages)
                if p:
                    found.append(Citation(rel_doc, n, p))
            for span in CODE_SPAN.findall(line):
                for word in _span_words(span):
                    p = _normalise(word, doc_dir, roots, False, packages)
                    if p:
                        new = moves.get(p)
                        if new is not None:
                            new = _normalise(new, doc_dir, roots, False, packages)
                        found.append(Citation(rel_doc, n, p, new))
    return found


def missing(root: Path = ROOT) -> list[Citation]:
    tracked = tracked_files(root)
    return [c for c in citations(root, tracked) if not is_tracked(c.moved_to or c.path, tracked)]


if __name__ == "__main__":
    for c in missing():
        print(c)
