"""TRL's GRPOTrainer on a tiny model: the skip mark, a dataset, a CPU config, a reward.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import importlib.util

import pytest

# find_spec, not an import: importing trl costs seconds, and every test file imports this one
needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install 'trl>=1.16')"
)


def trl_dataset(task, n):
    """The task's first n train samples as a `datasets.Dataset` of prompt and answer."""
    from datasets import Dataset

    samples = task.samples("train")[:n]
    return Dataset.from_dict(
        {"prompt": [s.prompt for s in samples], "answer": [s.answer for s in samples]}
    )


def tiny_grpo(task, output_dir, **args):
    """A tiny Qwen3 for the task's tokenizer and a CPU GRPOConfig (`args` override its fields)."""
    from trl import GRPOConfig

    from fp8rl.models import tiny_qwen3

    tok = task.tokenizer
    model = tiny_qwen3(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2
    )
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    defaults = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        max_steps=6,
        logging_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=4,
        learning_rate=1e-2,
        seed=0,
        save_strategy="no",
        bf16=False,
        temperature=1.0,
        disable_tqdm=True,
    )
    return model, GRPOConfig(**{**defaults, **args})


def trl_parity_reward(completions, **kwargs):
    """TRL's form of parity_reward: mixed rewards for a random model, non-zero advantages."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def fp8_trainer(task, model, args, **fp8rl_options):
    """fp8rl's GRPOTrainer on the task's first 32 train samples with the parity reward;
    `fp8rl_options`: calibration_interval, calibration, ..."""
    from fp8rl.integrations import trl as fp8trl

    return fp8trl.fp8_grpo_trainer_class()(
        model=model,
        reward_funcs=trl_parity_reward,
        args=args,
        train_dataset=trl_dataset(task, 32),
        processing_class=task.tokenizer,
        **fp8rl_options,
    )
