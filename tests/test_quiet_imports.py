"""Importing fp8rl and running the README's Python example print nothing on stderr, while
warnings and log records that are not known peer noise still show."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

IMPORTS = (
    "import fp8rl; from fp8rl.fp8 import Fp8Linear; "
    "from fp8rl.train.trainer import Trainer; from fp8rl.rollout import RolloutEngine"
)


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def test_imports_and_readme_example_print_nothing_on_stderr():
    code = "\n".join(
        [
            IMPORTS,
            "import sys",
            # transformers' model classes (and torchao behind them) load only when a model is
            # built: a lazy import that regresses brings back seconds and the noise
            "assert 'transformers.modeling_utils' not in sys.modules",
            "assert 'torchao' not in sys.modules",
            readme_example(),
        ]
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_other_warnings_and_records_still_show():
    code = "\n".join(
        [
            "import logging, warnings",
            "import fp8rl, torch",
            # the known noise, as torchao and torch word it, is dropped ...
            "logging.getLogger('torchao').warning("
            "'Failed to load /x/torchao/_C_mxfp8.abi3.so: Could not load this library')",
            "logging.getLogger('torch.utils._pytree').warning("
            "'%s is an Enum subclass and is now natively supported by torch.compile as an '"
            "'opaque value type. Calling register_constant() on Enum subclasses is deprecated', "
            "'E')",
            # ... and nothing else is
            "logging.getLogger('torchao').warning('torchao: a real problem')",
            "logging.getLogger('torch.utils._pytree').warning('pytree: a real problem')",
            "logging.getLogger('torchao').warning('Failed to load my_own_plugin.so: oops')",
            "warnings.warn('user code: a real problem')",
        ]
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    for text in (
        "torchao: a real problem",
        "pytree: a real problem",
        "my_own_plugin.so",
        "user code: a real problem",
    ):
        assert text in proc.stderr, (text, proc.stderr)
    assert "_C_mxfp8" not in proc.stderr and "Enum subclass" not in proc.stderr, proc.stderr
