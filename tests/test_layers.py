"""The layer rule of docs/architecture.md, read from the source: a layer imports only the
layers below it (`fp8rl.errors`, `fp8rl.utils` and `fp8rl._quiet` are leaves any layer may
import)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fp8rl"
LEAVES = {"errors", "utils", "_quiet"}
# each layer -> the layers it may import; keep in step with docs/architecture.md
ORDER = ["fp8", "rl", "models", "tasks", "rollout", "train", "integrations", "study"]
ALLOWED = {
    "fp8": set(),
    "rl": set(),
    "models": {"fp8"},
    "tasks": {"models"},
    "rollout": {"fp8", "models", "rl"},
    **{layer: set(ORDER[:i]) for i, layer in enumerate(ORDER) if i >= ORDER.index("train")},
    "errors": set(),
    "utils": set(),
    "_quiet": set(),
}
TOP = {"cli", "__main__", "__init__"}  # the command line sits above every layer


def _imported_layers(path: Path) -> set[str]:
    """The fp8rl top-level packages/modules `path` imports (relative imports resolved)."""
    package = ["fp8rl", *path.relative_to(SRC).parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
