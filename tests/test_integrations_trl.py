"""fp8rl inside TRL's GRPOTrainer, on the CPU with a tiny Qwen3 and a local tokenizer.

Skips when trl isn't importable (it is an optional integration; `pip install trl`).
"""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach the Hub

from fp8rl.integrations import trl as fp8trl  # noqa: E402
from helpers_trl import fp8_trainer, needs_trl, tiny_grpo  # noqa: E402


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


@needs_trl
def test_grpo_steps_in_fp8_with_calibrated_bounds(tmp_path):

    from fp8rl.fp8 import Fp8Linear
    from fp8rl.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", train_size=32, test_size=4)
    model, args = tiny_grpo(task, tmp_path)
    trainer = fp8_trainer(task, model, args, calibration_interval=2)
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
