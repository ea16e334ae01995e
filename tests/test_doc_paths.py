"""Every repository path that README.md and docs/*.md cite is tracked by git (doc_paths.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import doc_paths


def _repo(tmp_path: Path, files: dict[str, str], untracked: dict[str, str]) -> Path:
    for name, text in {**files, **untracked}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", *files], cwd=tmp_path, check=True)
    return tmp_path


def test_the_docs_cite_only_tracked_paths():
    cited = doc_paths.citations()
    # the check reads real citations: a parser that found none would pass vacuously
    assert len(cited) > 100
    assert {"README.md", "docs/study-long.md"} <= {c.doc for c in cited}
    missing = doc_paths.missing()
    assert not missing, "cited but not in git:\n" + "\n".join(map(str, missing))


def test_constructed_docs(tmp_path):
    doc = "\n".join(
        [
            "See [the data](study/raw.json) and [gone](study/gone.json).",  # 1: relative link
            "Runs in `docs/study/runs/ARM/seed-S/` and `docs/absent/ARM/`.",  # 2: placeholders
            "Rerun `python -m fp8rl.study.x docs/study/raw.json --out docs/new-out`.",  # 3
            "Written by `fp8rl sweep spec.yaml --out runs/x` to `runs/x/cells.md`.",  # 4
            "The rule is `fp8rl/rl/rule.py`; a metric `fp8rl/calib/lower`.",  # 5
            "```bash",
            "cat docs/in-a-block.json",  # command listings are not read
            "```",
            "A web page [x](https://example.org/docs/nothing) and `configs/missing.yaml`.",  # 9
        ]
    )
    root = _repo(
        tmp_path,
        {
            "README.md": "The [docs](docs/study.md).\n",
            "docs/study.md": doc,
            "docs/study/raw.json": "{}",
            "docs/study/runs/bf16/seed-0/config.json": "{}",
            "src/fp8rl/rl/rule.py": "",
            "configs/there.yaml": "",
        },
        untracked={"docs/study/gone.json": "{}"},  # on disk, not in git: still missing
    )
    found = {(c.line, c.path) for c in doc_paths.citations(root) if c.doc == "docs/study.md"}
    assert found == {
        (1, "docs/study/raw.json"),
        (1, "docs/study/gone.json"),
        (2, "docs/study/runs"),
        (2, "docs/absent"),
        (3, "docs/study/raw.json"),
        (5, "src/fp8rl/rl/rule.py"),
        (9, "configs/missing.yaml"),
    }
    missing = {(c.doc, c.line, c.path) for c in doc_paths.missing(root)}
    assert missing == {
        ("docs/study.md", 1, "docs/study/gone.json"),
        ("docs/study.md", 2, "docs/absent"),
        ("docs/study.md", 9, "configs/missing.yaml"),
    }


@pytest.mark.parametrize(
    ("path", "tracked"),
    [("docs/a", True), ("docs/a/", True), ("docs/a/b.json", True), ("docs/ab", False)],
)
def test_a_folder_is_tracked_when_it_holds_a_tracked_file(path, tracked):
    assert doc_paths.is_tracked(path, {"docs/a/b.json", "docs/abc.md"}) is tracked


def test_a_moved_path_stands_for_its_new_place(tmp_path):
    # a pre-registered protocol keeps the path it cites; a dated note says where it went
    note = "[2026-12-02: `fp8rl/rl/rule.py` moved to `fp8rl/study/rule.py`]"
    doc = f"The rule is `fp8rl/rl/rule.py`.\n{note}\nAnd `fp8rl/rl/gone.py`.\n"
    files = {"docs/study.md": doc, "src/fp8rl/study/rule.py": "", "src/fp8rl/rl/x.py": ""}
    root = _repo(tmp_path, files, {})
    (root / "README.md").write_text("")
    missing = {(c.line, c.path) for c in doc_paths.missing(root)}
    assert missing == {(3, "src/fp8rl/rl/gone.py")}
