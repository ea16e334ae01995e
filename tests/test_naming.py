"""One word for the BF16 twin of an FP8 value: `shadow` (docs/architecture.md). No identifier
in src/ ends in `_ref` unless it is listed below with the reason it is not the shadow, so "ref"
stays free for verl's KL reference policy and a new `*_ref` name fails here.

No two modules in src/fp8rl share a file name (`__init__.py` aside): a name says which module
it is without its folder, in a traceback, an import or a doc."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fp8rl"

# (file under src/fp8rl, identifier) -> why it keeps its name
EXCEPTIONS = {
    ("rl/calibration.py", "rho_ref"): "CalibrationResult's field, saved in checkpoints' "
    "calibration history and logged as the metric calib/rho_ref (docs/rl.md)",
    ("study/long_verdict.py", "NO_VERDICT_REF"): "a reference to the verdict text, not a tensor",
    ("study/real_noise.py", "lp_ref"): "the unquantized model a post-hoc probe compares "
    "FP8 copies with (its `refs`), not a training step's shadow pass",
    ("study/real_noise.py", "p_ref"): "as lp_ref: the probe's unquantized model",
    ("study/real_noise.py", "hidden_ref"): "as lp_ref: the probe's unquantized model",
}


def identifiers(tree: ast.AST):
    """(line, name) of every name the code defines or uses: functions, classes, parameters,
    variables (assigned or read), attributes, keyword arguments and import aliases."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.lineno, node.arg
        elif isinstance(node, ast.alias):
            yield node.lineno, node.asname or node.name.rpartition(".")[2]


def ref_names(root: Path = SRC) -> dict[tuple[str, str], int]:
    """(file, identifier) -> first line, for each identifier ending in `_ref` (any case)."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, name in identifiers(ast.parse(path.read_text(encoding="utf-8"))):
            if name.lower().endswith("_ref"):
                found.setdefault((rel, name), line)
    return found


def test_the_scan_sees_every_kind_of_name(tmp_path):
    (tmp_path / "m.py").write_text(
        "import a.b_ref\nfrom c import d as e_ref\n"
        "class C_ref:\n    def f_ref(self, g_ref, *, h_ref=1):\n        self.i_ref = j_ref\n"
        "k_ref = call(l_ref=2)\nfor m_ref in x: pass\nx = lambda n_ref: n_ref\n",
        encoding="utf-8",
    )
    got = {name for _, name in ref_names(tmp_path)}
    assert got == {f"{c}_ref" for c in "bCefghijklmn"}


def test_no_shadow_name_ends_in_ref():
    found = ref_names()
    new = [
        f"src/fp8rl/{f}:{line} {name}"
        for (f, name), line in found.items()
        if (f, name) not in EXCEPTIONS
    ]
    assert not new, (
        "the BF16 twin is `*_shadow` (log_prob_shadow, old_log_prob_shadow, ratio_shadow); "
        "rename, or list a name that is not the shadow in EXCEPTIONS with why:\n" + "\n".join(new)
    )


def test_every_exception_is_still_in_the_code():
    stale = sorted(set(EXCEPTIONS) - set(ref_names()))
    assert not stale, f"listed in EXCEPTIONS but gone from src/: {stale}"


def shared_file_names(root: Path = SRC) -> dict[str, list[str]]:
    """file name -> the modules under `root` holding it, for each name two or more share."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py":
            where.setdefault(path.name, []).append(path.relative_to(root).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_the_file_name_scan_sees_a_shared_name(tmp_path):
    for rel in ("a/__init__.py", "b/__init__.py", "a/build.py", "b/build.py", "b/c/x.py", "y.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("", encoding="utf-8")
    assert shared_file_names(tmp_path) == {"build.py": ["a/build.py", "b/build.py"]}


def test_no_two_modules_share_a_file_name():
    shared = shared_file_names()
    assert not shared, (
        "two modules in src/fp8rl share a file name; rename one for what it holds: "
        + "; ".join(", ".join(paths) for paths in shared.values())
    )
