"""The tiny model and VllmRolloutEngine the vLLM tests share (import after
`pytest.importorskip("vllm")`): one engine start takes ~20 s, so each module builds one."""

from fp8rl.fp8 import convert_to_fp8
from fp8rl.models import tiny_qwen3
from fp8rl.rollout.vllm_engine import VllmRolloutEngine
from fp8rl.tasks import get_task


def tiny_vllm_setup():
    """(model, tokenizer, engine): a tiny Qwen3 in the trainer's FP8 layout (high precision
    unless a recipe is asked for) and a vLLM engine holding its weights."""
    tok = get_task("arithmetic").tokenizer
    model = tiny_qwen3(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2
    )
    model.config.eos_token_id = tok.eos_token_id
    convert_to_fp8(model, "rowwise")
    engine = VllmRolloutEngine(model, tok, options={"max_model_len": 64}, seed=0)
    return model, tok, engine
