"""fp8rl: full-pipeline FP8 reinforcement learning of LLMs, kept stable by Calibrated Clipping."""

__version__ = "0.1.0"
