"""fp8rl: full-pipeline FP8 reinforcement learning of LLMs, kept stable by Calibrated Clipping."""

from . import _quiet

# before any submodule can import transformers (and, through it, torchao)
_quiet.install()

__version__ = "0.1.0"
