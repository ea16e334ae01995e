"""Size limits that keep the code base readable in small pieces (issue 34): no file in src/ or
bench/ over 500 lines, no function there over 80. A file that outgrows its limit is split by
concern, not trimmed."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for d in ("src", "bench") for p in (ROOT / d).rglob("*.py"))


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT)) if ROOT in p.parents else str(p)


def long_files(paths) -> list[str]:
    out = []
    for p in paths:
        n = len(p.read_text().splitlines())
        if n > MAX_FILE_LINES:
            out.append(f"{_name(p)}: {n} lines")
    return out


def long_functions(paths) -> list[str]:
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # decorators aside, docstring included
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{_name(p)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_file_over_500_lines():
    paths = _sources()
    assert len(paths) > 100  # the walk found the code base
    bad = long_files(paths)
    assert not bad, "split these files by concern:\n" + "\n".join(bad)


def test_no_function_over_80_lines():
    bad = long_functions(_sources())
    assert not bad, "split these functions:\n" + "\n".join(bad)


def test_the_limits_see_a_long_file_and_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "f.py").write_text(f"def f():\n{body}\n" + "\n" * MAX_FILE_LINES)
    path = tmp_path / "f.py"
    assert len(long_files([path])) == 1 and len(long_functions([path])) == 1
