"""The repository's scripts/*.py, imported as modules for their tests.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """scripts/NAME.py as a module (scripts are no package: imported by path)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
