"""fp8rl inside TRL's GRPOTrainer, on the CPU with a tiny Qwen3 and a local tokenizer.

Skips when trl isn't importable (it is an optional integration; `pip install trl`).
"""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach the Hub

from fp8rl.integrations import trl as fp8trl  # noqa: E402


def test_module_imports_without_trl_and_names_it_when_used(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_trl(name, *args, **kwargs):
        if name == "trl" or name.startswith("trl."):
            raise ImportError("No module named 'trl'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_trl)
    monkeypatch.setattr(fp8trl, "_CLASS", None)
    assert not fp8trl.trl_available()
    with pytest.raises(ImportError, match="pip install 'trl"):
        fp8trl.fp8_grpo_trainer_class()


needs_trl = pytest.mark.skipif(
    not fp8trl.trl_available(), reason="trl is not installed (pip install 'trl>=1.16')"
)


def _dataset(task, n):
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


def parity_reward(completions, **kwargs):
    """Mixed rewards for a random model (as in the fp8rl loop tests): non-zero advantages."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


@needs_trl
def test_grpo_steps_in_fp8_with_calibrated_bounds(tmp_path):

    from fp8rl.fp8 import Fp8Linear
    from fp8rl.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", train_size=32, test_size=4)
    tok = task.tokenizer
    model, args = tiny_grpo(task, tmp_path)
    trainer = fp8trl.fp8_grpo_trainer_class()(
        model=model,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=_dataset(task, 32),
        processing_class=tok,
        calibration_interval=2,
    )
    assert any(isinstance(m, Fp8Linear) and m.recipe is not None for m in model.modules())
    trainer.calibration.min_tokens = 2  # a tiny batch: let Algorithm 1 run on few tokens
    nominal = trainer.calibration.nominal
    trainer.train()
    logs = [h for h in trainer.state.log_history if "fp8rl/calib/lower" in h]
    assert len(logs) == 6
    for h in logs:
        for key in ("fp8rl/clipfrac", "fp8rl/clipfrac_lower_neg", "fp8rl/calib/upper"):
            assert key in h, key
    # generation batches start at steps 0, 2, 4; interval 2: all are shadow batches, with the
    # shadow passes on both their steps. A batch's statistics reach the state as the next one
    # is generated: batch 0's never enter the pool (step 0), batch 2's refit at generation 4
    shadow = ["fp8rl/shadow/nmae_prob" in h for h in logs]
    assert shadow == [True] * 6
    # the shadow core's metrics, the Trainer's: the per-pass noise S and C too
    assert all("fp8rl/shadow/logprob_err_sd" in h for h in logs)
    assert ["fp8rl/calib/next_lower" in h for h in logs] == [
        False,
        False,
        False,
        False,
        True,
        False,
    ]
    history = trainer.calibration.history
    assert [h["step"] for h in history] == [2] and history[0]["n_neg"] + history[0]["n_pos"] > 0
    assert history[0]["pool_steps"] == 1
    # steps 0-3 clip at the nominal bounds; the refit moved them for the steps after
    for h in logs[:4]:
        assert (h["fp8rl/calib/lower"], h["fp8rl/calib/upper"]) == pytest.approx(nominal)
    moved = (logs[4]["fp8rl/calib/lower"], logs[4]["fp8rl/calib/upper"])
    assert moved != pytest.approx(nominal)
    assert moved == pytest.approx((history[0]["lower"], history[0]["upper"]))
    # TRL clipped with them: its epsilons are the calibrated bounds
    assert (1 - trainer.epsilon_low, 1 + trainer.epsilon_high) == pytest.approx(
        (logs[-1]["fp8rl/calib/lower"], logs[-1]["fp8rl/calib/upper"])
    )
    assert torch.isfinite(
        torch.tensor([h["loss"] for h in trainer.state.log_history if "loss" in h])
    ).all()
