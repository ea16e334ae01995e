"""The demo numbers the docs quote are those of the committed docs/demo/summary.json: README.md's
table and the numbers its text quotes, and docs/benchmarks.md's table (the rows of the demo's
own summary.md), each formatted from that file by the code that formats them
(fp8rl.study.demo). Rerun the demo and copy its summary here whenever results change
(scripts/behaviour_check.py shows when); then this test shows the lines to paste."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fp8rl.study.demo import README_HEAD, _arm_row, readme_sentence, readme_table

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "demo" / "summary.json"


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads(SUMMARY.read_text())


def _section(doc: Path, heading: str) -> list[str]:
    """The lines of a markdown section, from its heading to the next heading of any level."""
    lines = doc.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    assert start is not None, f"{doc.name}: no section {heading!r}"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def _table(lines: list[str], head_start: str) -> list[str]:
    """The rows of the table whose header row starts with `head_start`, header included."""
    start = next((i for i, line in enumerate(lines) if line.startswith(head_start)), None)
    assert start is not None, f"no table whose header starts {head_start!r}"
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def test_the_summary_names_its_commit_and_warm_start(summary):
    assert re.fullmatch(r"[0-9a-f]{40}", summary["code"]["commit"])
    assert summary["code"]["changed"] == []  # made by committed code, nothing edited
    weights = ROOT / summary["warm_start"]["weights"]
    info = json.loads(weights.with_suffix(".json").read_text())
    assert summary["warm_start"]["sha256"] == info["sha256"]


def test_the_readme_table_is_the_summary_s(summary):
    table = _table(_section(ROOT / "README.md", "## What the demo shows"), README_HEAD)
    expected = readme_table(summary)
    assert table == expected, "README.md's demo table should read:\n" + "\n".join(expected)


def test_the_readme_quotes_the_summary_s_numbers(summary):
    text = " ".join(" ".join(_section(ROOT / "README.md", "## What the demo shows")).split())
    sentence = readme_sentence(summary)
    assert sentence in text, f"README.md should say: {sentence}"
    commit = summary["code"]["commit"][:7]
    assert f"commit {commit}" in text, f"the README should name the demo's commit {commit}"


def test_the_benchmarks_table_is_the_summary_s(summary):
    section = _section(ROOT / "docs" / "benchmarks.md", "## The demo")
    rows = [line for line in section if line.startswith(("| bf16 |", "| fp8"))]
    expected = [_arm_row(arm, r) for arm, r in summary["runs"].items()]
    assert rows == expected, "docs/benchmarks.md's demo table should read:\n" + "\n".join(expected)
