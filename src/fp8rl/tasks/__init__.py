"""Verifiable tasks and rewards: synthetic arithmetic (the CPU demo) and math word problems.

Heavy libraries (transformers, math-verify, pyarrow) are imported where first needed, so
grading worker processes that import this package start quickly.
"""

from .answer_extraction import extract_answer
from .arithmetic import ArithmeticConfig, ArithmeticTask
from .arithmetic_qa import ArithmeticQAConfig, ArithmeticQATask
from .base import SPLITS, RewardResult, Sample, Task, prompt_inputs
from .chain_arithmetic import ChainArithmeticConfig, ChainArithmeticTask
from .char_tokenizer import char_tokenizer
from .chat import chat_task
from .math_task import DEFAULT_TEMPLATE, FIXTURE_PATH, MathConfig, MathTask
from .metrics import mean_at_k, pass_at_k, score_responses
from .registry import TASKS, get_task
from .scoring import BatchScores, score_batch
from .sft import encode_pairs

__all__ = [
    "DEFAULT_TEMPLATE",
    "FIXTURE_PATH",
    "SPLITS",
    "TASKS",
    "ArithmeticConfig",
    "ArithmeticQAConfig",
    "ArithmeticQATask",
    "ArithmeticTask",
    "BatchScores",
    "ChainArithmeticConfig",
    "ChainArithmeticTask",
    "MathConfig",
    "MathTask",
    "RewardResult",
    "Sample",
    "Task",
    "char_tokenizer",
    "chat_task",
    "encode_pairs",
    "extract_answer",
    "get_task",
    "mean_at_k",
    "pass_at_k",
    "prompt_inputs",
    "score_batch",
    "score_responses",
]
