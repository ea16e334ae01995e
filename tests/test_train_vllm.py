"""`fp8rl train rollout.engine=vllm` end to end: GRPO with vLLM rollouts improves a warm
start, and a run killed mid-way resumes to the uninterrupted run's metrics. Runs where vLLM is
installed (scripts/check-vllm.sh); each run starts an engine (~20 s)."""

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/check-vllm.sh")

from fp8rl.config import config_from_dict  # noqa: E402
from fp8rl.train.trainer import Trainer  # noqa: E402
from helpers_runs import killed_and_resumed, strip_times, warm_started  # noqa: E402

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}


def config(out_dir, precision="fp8-rowwise", **sections) -> dict:
    data = {
        "name": "v",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 80, "test_size": 20},
        },
        "model": {"source": "tiny", "tiny": dict(TINY)},
        "rollout": {
            "engine": "vllm",
            "vllm": {"max_model_len": 64},
            "precision": precision,
            "prompts_per_step": 16,
            "n": 8,
            "max_new_tokens": 4,
        },
        "train": {"precision": precision, "steps": 2, "lr": 2e-3, "mini_batches": 2},
        "loss": {"mode": "grpo"},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 0, "eval_size": 0, "progress": False},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def test_grpo_with_vllm_rollouts_improves_a_warm_start(tmp_path):
    from fp8rl.train.evaluate import evaluate_policy

    data = config(tmp_path / "run", train={"steps": 30, "lr": 3e-4, "mini_batches": 4})
    data["model"]["init_weights"] = str(warm_started(tmp_path / "warm.safetensors", data, steps=60))
    trainer = Trainer(config_from_dict(data))

    def sampled_reward():  # every train prompt, 8 samples at the rollout's temperature
        out = evaluate_policy(
            trainer.model,
            trainer.eval_engine,
            trainer.task,
            split="train",
            limit=80,
            max_new_tokens=4,
            k=8,
            temperature=1.0,
            seed=1,
        )
        return out["eval/mean@8"]

    before = sampled_reward()
    rows = trainer.fit()
    after = sampled_reward()
    assert after > before + 0.05, (before, after)  # 640 samples: SE ~0.02 each
    assert all(r["time/weight_sync"] > 0 for r in rows)  # sync_every 1: a push every step
    # the rollout's FP8 is its weights' only (fake-quantized), the trainer's W8A8: they differ
    assert all(0 < r["mismatch/kl_rollout_train"] < 0.05 for r in rows)
    events = (tmp_path / "run" / "events.log").read_text()
    assert "rollout.engine=vllm" in events and "fake-quantized" in events


def test_resume_after_kill_gives_the_uninterrupted_runs_metrics(tmp_path):
    steps = 8
    data = config(
        tmp_path / "x",
        precision="fp32",
        train={"steps": steps},
        log={"checkpoint_every": 2},
    )
    data["model"]["init_weights"] = str(warm_started(tmp_path / "warm.safetensors", data, steps=30))
    cfg_path = tmp_path / "cfg.json"  # JSON is YAML
    cfg_path.write_text(json.dumps(data))
    runs = killed_and_resumed(cfg_path, tmp_path, steps=steps, kill_after=3, timeout=600)
    a, b = (strip_times(rows) for rows in runs)
    assert [r["step"] for r in b] == list(range(steps))
    assert a == b
    # same precision in both engines: the rollout's log-probs are the trainer's
    assert all(r["mismatch/kl_rollout_train"] < 1e-6 for r in a)
    # vLLM returns no entropy: the trainer's old-log-prob pass gives it, every step
    assert all(r["rollout/entropy"] > 0 for r in a)
    assert sum(r["actor/grad_norm"] > 0 for r in a) >= 2  # the runs really trained
