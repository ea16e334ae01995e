"""Fp8GRPOTrainer with TRL's colocated vLLM generation (`use_vllm=True, vllm_mode="colocate"`)
on the CPU: the weights vLLM samples with follow the trainer's, and the calibration still sees
the trainer's FP8 log-probs and their BF16 shadows. Runs in the vLLM venv with trl installed
(scripts/check-vllm.sh); skips elsewhere."""

import os

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/check-vllm.sh")
pytest.importorskip("trl", reason="trl is not installed here: pip install 'trl>=1.16'")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fp8rl.fp8 import Fp8Linear  # noqa: E402
from fp8rl.tasks import get_task  # noqa: E402
from helpers_trl import fp8_trainer, tiny_grpo  # noqa: E402


def engine_log_probs(llm, seq: list[int]) -> torch.Tensor:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    out = llm.generate([{"prompt_token_ids": seq}], params, use_tqdm=False)[0]
    return torch.tensor(
        [d[t].logprob for t, d in zip(seq[1:], out.prompt_logprobs[1:], strict=True)]
    )


def reference_log_probs(model, seq: list[int]) -> torch.Tensor:
    """float64 log-probs of `seq` under a plain float64 Qwen3 holding the trainer's weights
    (no Fp8Linear, so no cached quantized weight can stand in for the current ones)."""
    import transformers

    ref = transformers.Qwen3ForCausalLM(model.config).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    ids = torch.tensor([seq])
    with torch.no_grad():
        logp = torch.log_softmax(ref(ids).logits[0].double(), -1)
    return logp[torch.arange(len(seq) - 1), ids[0, 1:]]


def test_colocated_vllm_follows_the_trainer_and_calibration_sees_fp8_and_bf16(tmp_path):
    task = get_task("arithmetic", digits=1, ops="+", train_size=32, test_size=4)
    tok = task.tokenizer
    model, args = tiny_grpo(
        task,
        tmp_path,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.05,
        vllm_max_model_length=64,
    )
    folder = tmp_path / "model"  # TRL builds its vllm.LLM from the model's path
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model.name_or_path = model.config._name_or_path = str(folder)
    trainer = fp8_trainer(task, model, args, calibration_interval=2)
    assert any(isinstance(m, Fp8Linear) and m.recipe is not None for m in model.modules())
    gen = trainer.vllm_generation
    pushes = []
    patched = gen.sync_weights
    gen.sync_weights = lambda: (pushes.append(trainer.state.global_step), patched())[1]
    trainer.calibration.min_tokens = 2
    seq = tok("3+4=7")["input_ids"]
    before = reference_log_probs(model, seq)
    trainer.train()
    # a push before each generation batch (steps 0, 2, 4), through fp8rl's in-place reload
    assert pushes == [0, 2, 4]
    logs = [h for h in trainer.state.log_history if "fp8rl/calib/lower" in h]
    assert len(logs) == 6 and all("fp8rl/shadow/nmae_prob" in h for h in logs)
    # FP8 and BF16 trainer log-probs differ (the shadow sees quantization error), and
    # Algorithm 1 refit on them as without vLLM (batch 2's pool, at generation 4)
    assert max(h["fp8rl/shadow/nmae_prob"] for h in logs) > 0
    assert [h["step"] for h in trainer.calibration.history] == [2]
    assert any("sampling/sampling_logp_difference/mean" in h for h in trainer.state.log_history)
    # the push: after the last optimizer steps, vLLM scores with the trainer's current weights.
    # TRL's vLLM runs bfloat16 here (dtype "auto" of a float32 model on the CPU): the
    # tolerance is bf16 rounding (measured 1-3e-3), 20x below how far the weights moved
    gen.sync_weights()
    want = reference_log_probs(model, seq)
    assert (want - before).abs().max() > 0.2  # the premise: a stale engine would be caught
    torch.testing.assert_close(engine_log_probs(gen.llm, seq).double(), want, atol=1e-2, rtol=0)
