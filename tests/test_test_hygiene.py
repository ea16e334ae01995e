"""The test suite's own shape: a test file imports no other test file (shared helpers live in
the tests/helpers_*.py modules, one for each kind of thing they build, and fixtures in
tests/conftest.py), so each one reads and runs on its own and a rename moves one file."""

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
    assert not found, "import the helper from a tests/helpers_*.py module instead:\n" + "\n".join(
        found
    )


# What a helper module may import at its top: it is imported in the vLLM venv too
# (scripts/check-vllm.sh), which has these; fp8rl and the peers are imported inside functions.
HELPER_TOP_IMPORTS = {"__future__", "pytest", "torch", "numpy", "hypothesis"}


def _top_level_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or ""))
    return out


def test_helper_modules_import_at_the_top_only_what_every_venv_has():
    import sys

    helpers = sorted(TESTS.glob("helpers_*.py"))
    assert len(helpers) >= 5, helpers  # the glob found the helper modules
    allowed = HELPER_TOP_IMPORTS | set(sys.stdlib_module_names) | {p.stem for p in helpers}
    found = [
        f"{path.name}:{line} imports {name}"
        for path in helpers
        for line, name in _top_level_imports(path)
        if name.split(".")[0] not in allowed
    ]
    assert not found, "import it inside the helper that needs it:\n" + "\n".join(found)
    assert not (TESTS / "helpers.py").exists()  # one module for each kind of helper instead
