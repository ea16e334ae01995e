"""The test suite's own shape: a test file imports no other test file (shared helpers live in
tests/helpers.py and fixtures in tests/conftest.py), so each one reads and runs on its own and
a rename moves one file."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(tree: ast.AST):
    """Every module an import names, at the top or inside a function: `import a.b`, `from a.b
    import c` (as a.b and a.b.c, since c may be a module), relative imports by their tail."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def _test_module_imports(path: Path, root: Path = TESTS) -> list[str]:
    """'file:line imports test_module' for each import of a test module in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = {}
    for line, name in _imported_modules(tree):
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part.startswith("test_"):
                hits[f"{path.relative_to(root)}:{line} imports {'.'.join(parts[: i + 1])}"] = None
                break
    return list(hits)


def test_the_check_sees_every_form_of_import(tmp_path):
    for source in (
        "from test_train_loop import tiny_config\n",
        "def f():\n    import tests.test_sweep as s\n",
        "from . import test_demo\n",
        "from tests import test_demo\n",
    ):
        (tmp_path / "test_x.py").write_text(source)
        assert _test_module_imports(tmp_path / "test_x.py", root=tmp_path), source
    (tmp_path / "test_x.py").write_text("from helpers import tiny_config\nimport testing\n")
    assert not _test_module_imports(tmp_path / "test_x.py", root=tmp_path)


def test_no_test_file_imports_another():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50, files  # the glob found the suite
    found = [hit for path in files for hit in _test_module_imports(path)]
    assert not found, "import the helper from tests/helpers.py instead:\n" + "\n".join(found)
