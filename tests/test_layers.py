"""The layer rule of docs/architecture.md, read from the source: a layer imports only the
layers below it (`fp8rl.errors`, `fp8rl.utils`, `fp8rl._quiet` and `fp8rl._cpu_env` are leaves
any layer may import), and no two fp8rl modules import each other, directly or through others.
Every import counts, lazy ones and those under `if TYPE_CHECKING:` too: a type-only import is a
dependency of the reader all the same, and a circle of them hides the same tangle."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fp8rl"
LEAVES = {"errors", "utils", "_quiet", "_cpu_env"}
# each layer -> the layers it may import; keep in step with docs/architecture.md
ORDER = ["fp8", "rl", "models", "tasks", "rollout", "config", "step", "train"]
ABOVE_TRAIN = ["integrations", "study"]  # side by side: neither imports the other
ALLOWED = {
    "fp8": set(),
    "rl": set(),
    "models": {"fp8"},
    "tasks": {"models"},
    "rollout": {"fp8", "models", "rl"},
    **{layer: set(ORDER[:i]) for i, layer in enumerate(ORDER) if i >= ORDER.index("config")},
    **{layer: set(ORDER) for layer in ABOVE_TRAIN},
    # the adapters run inside verl's and TRL's loops, never the Trainer's: below train only
    "integrations": set(ORDER) - {"train"},
    "errors": set(),
    "utils": set(),
    "_quiet": set(),
    "_cpu_env": set(),
}
# the command line sits above every layer
TOP = {"cli", "cli_common", "cli_eval", "cli_model", "__main__", "__init__"}


def _imported_layers(path: Path) -> set[str]:
    """The fp8rl top-level packages/modules `path` imports (relative imports resolved)."""
    package = ["fp8rl", *path.relative_to(SRC).parts[:-1]]
    found = set()
    for node in _imports(ast.parse(path.read_text()).body):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = (
                    [".".join([*base, node.module])]
                    if node.module
                    else [".".join([*base, a.name]) for a in node.names]
                )
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("fp8rl.")}
    return found


def test_every_layer_imports_only_the_layers_below_it():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        layer = path.relative_to(SRC).parts[0].removesuffix(".py")
        if layer in TOP:
            continue
        assert layer in ALLOWED, f"{layer}: a new layer; place it in docs/architecture.md and here"
        for target in sorted(_imported_layers(path) - {layer} - LEAVES - ALLOWED[layer]):
            bad.append(f"{path.relative_to(SRC.parent)} imports fp8rl.{target}")
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_train_does_not_import_study():
    # the demo, sweeps, report plots and diagnose sit above the loop, never inside it
    assert "study" not in ALLOWED["train"]
    assert all("study" not in _imported_layers(p) for p in (SRC / "train").rglob("*.py"))


def test_the_layer_finder_reads_type_only_imports():
    tree = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fp8rl.train import x\n"
    assert [n.module for n in _imports(ast.parse(tree).body)] == ["typing", "fp8rl.train"]


# ---------------------------------------------------------------- import cycles

MODULES = {
    ".".join(p[:-1] if p[-1] == "__init__" else p): path
    for path in SRC.rglob("*.py")
    for p in [("fp8rl", *path.relative_to(SRC).with_suffix("").parts)]
}
# Cycles other branches of issue 24 remove; the merge that removes one deletes its entry.
KNOWN_CYCLES: set[frozenset[str]] = set()  # none: a cycle that must stay is named here


def _imports(body: list[ast.stmt]):
    """Every import statement: in functions and classes too (a lazy import is a dependency
    all the same), and under `if TYPE_CHECKING:` (a type-only one as well)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child])
                elif isinstance(child, ast.excepthandler):
                    yield from _imports(child.body)


def _imported_modules(name: str, path: Path) -> set[str]:
    """The fp8rl modules `name` imports; for `from A import n` both A and, where it is a
    module, A.n. The package a module sits in is left out: it is imported first anyway."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + [base] * bool(base))
        found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    ancestors = {".".join(package.split(".")[:i]) for i in range(1, package.count(".") + 2)}
    return {m for m in found if m in MODULES and m != name and m not in ancestors}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while not component or v not in component:
                    component.add(stack.pop())
                on_stack -= component
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def test_no_import_cycle_between_fp8rl_modules():
    graph = {name: _imported_modules(name, path) for name, path in MODULES.items()}
    cycles = set(_cycles(graph))
    new = ["  " + " <-> ".join(sorted(c)) for c in cycles - KNOWN_CYCLES]
    assert not new, "import cycles (move the shared part into a leaf module):\n" + "\n".join(new)
    assert not KNOWN_CYCLES - cycles, "a known cycle is gone: delete its KNOWN_CYCLES entry"


def test_the_cycle_finder_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]


# ---------------------------------------------------------------- rl/ is pure tensors

IO_MODULES = {"os", "pathlib", "io", "json", "gzip", "shutil", "tempfile", "glob", "csv", "zipfile"}
IO_MODULES |= {"pickle", "safetensors", "yaml", "sqlite3"}
IO_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "save", "load"}


def _file_io(source: str) -> list[str]:
    """'line: what' for each file-reading or -writing import or call in `source`."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            mods = [node.module or ""]
        else:
            mods = []
        hits += [(node.lineno, f"import {m}") for m in mods if m.split(".")[0] in IO_MODULES]
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in IO_CALLS:
                hits.append((node.lineno, f"{name}()"))
    return [f"{line}: {what}" for line, what in sorted(hits)]


def test_rl_does_no_file_io():
    # reading a run folder belongs to config/ (config/files.py), writing one to train/
    bad = [
        f"{p.relative_to(SRC.parent)}:{h}"
        for p in sorted((SRC / "rl").rglob("*.py"))
        for h in _file_io(p.read_text(encoding="utf-8"))
    ]
    assert not bad, "rl/ is pure tensor functions, yet:\n" + "\n".join(bad)


def test_the_file_io_finder_sees_reads_and_writes():
    src = "import json\nfrom pathlib import Path\nwith open(p) as f: pass\nPath(p).write_text(s)\n"
    assert _file_io(src) == ["1: import json", "2: import pathlib", "3: open()", "4: write_text()"]
