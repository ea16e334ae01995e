"""The one place that hides known-harmless messages of fp8rl's peers at import.

transformers imports torchao whenever it is installed (fp8rl's dev extra installs it), and
torchao then logs two kinds of lines that say nothing to an fp8rl user: the load failures of its
optional CUDA kernels on a machine without them, and torch's deprecation of the pytree
registration torchao still does for its enums. Only these records are dropped, each matched on
its own logger and text: every other record of these loggers, and every `warnings.warn`, shows.
"""

from __future__ import annotations

import logging
import re

# (logger name, pattern the record's unformatted message must match)
KNOWN_NOISE = (
    # torchao/__init__.py: `logger.warning(f"Failed to load {file}: {e}")` for its _C*.so files
    ("torchao", re.compile(r"Failed to load \S*torchao\S*_C\S*\.so: ")),
    # torch/utils/_pytree.py: register_constant() on an Enum subclass (torchao's enums)
    (
        "torch.utils._pytree",
        re.compile(r"%s is an Enum subclass .* Calling register_constant\(\) on Enum subclasses"),
    ),
)


class _DropKnown(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and self.pattern.match(record.msg))


def install() -> None:
    """Idempotent; must run before transformers first imports torchao."""
    for name, pattern in KNOWN_NOISE:
        logger = logging.getLogger(name)
        # a re-imported fp8rl (tests reloading it) must not stack filters
        if not any(isinstance(f, _DropKnown) and f.pattern is pattern for f in logger.filters):
            logger.addFilter(_DropKnown(pattern))
