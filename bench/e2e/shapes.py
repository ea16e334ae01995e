"""The Qwen3 shapes the device benches build (random weights, no downloads), the run's sizes
(`settings`) and the small builders every part uses."""

from __future__ import annotations

import torch

import _srcpath  # noqa: F401  (src/ on sys.path before fp8rl)
from fp8rl.fp8 import Fp8Recipe
from fp8rl.models.tiny import tiny_qwen3_config

RECIPES = ("tensorwise", "rowwise", "blockwise")
INTERVAL = 20  # the calibration interval the goals are stated at
NOMINAL = (0.8, 1.2)  # 1 - eps_low, 1 + eps_high

# Qwen3 shapes. Every linear dim is a multiple of 128, so all three recipes convert every
# projection (lm_head stays high precision, as everywhere in fp8rl).
_HEADS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)
SHAPES = {
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        vocab_size=151936,
        tie_word_embeddings=False,
        num_hidden_layers=36,
        **_HEADS,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=True,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "0.5b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        tie_word_embeddings=True,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "check": dict(
        hidden_size=512,
        intermediate_size=1536,
        vocab_size=2048,
        tie_word_embeddings=False,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
    ),
}
SMOKE_SHAPES = {
    "8b": dict(
        hidden_size=256,
        intermediate_size=768,
        vocab_size=1024,
        tie_word_embeddings=False,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "1b": dict(
        hidden_size=128,
        intermediate_size=384,
        vocab_size=1024,
        tie_word_embeddings=True,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "0.5b": dict(
        hidden_size=128,
        intermediate_size=384,
        tie_word_embeddings=True,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "check": dict(
        hidden_size=256,
        intermediate_size=768,
        vocab_size=512,
        tie_word_embeddings=False,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
}
COMMON = dict(max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6)


# ----------------------------------------------------------------------------- set-up


# ----------------------------------------------------------------------------- set-up


def settings(smoke: bool) -> dict:
    """Every size the run uses; the smoke mode shrinks them, nothing else changes."""
    if smoke:
        return dict(
            shapes=SMOKE_SHAPES,
            depths=(1, 2),
            project_layers=36,
            mb_rows=2,
            prompt_len=8,
            response_len=24,
            mini_batches=2,
            warmup=1,
            reps=2,
            roll_prompt_len=8,
            roll_new_tokens=6,
            roll_reps=1,
            grpo_steps=4,
            grpo_interval=2,
            grpo_prompts=8,
            grpo_n=4,
            grpo_new_tokens=6,
            grpo_min_tokens=8,
            check_tokens=(2, 16),
        )
    return dict(
        shapes=SHAPES,
        depths=(1, 4),
        project_layers=36,
        mb_rows=8,
        prompt_len=128,
        response_len=896,
        mini_batches=4,
        warmup=3,
        reps=10,
        roll_prompt_len=128,
        roll_new_tokens=64,
        roll_reps=2,
        grpo_steps=40,
        grpo_interval=INTERVAL,
        grpo_prompts=32,
        grpo_n=8,
        grpo_new_tokens=8,
        grpo_min_tokens=32,
        check_tokens=(4, 128),
    )


def build_qwen3(shape: dict, device, dtype, *, layers: int | None = None, seed: int = 0):
    """A random Qwen3 (transformers' own class) built directly on `device` in `dtype`."""
    from transformers import Qwen3ForCausalLM

    over = {**COMMON, **shape}
    if layers is not None:
        over["num_hidden_layers"] = layers
    cfg = tiny_qwen3_config(**over)
    old = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def recipe(name: str, check_finite: bool) -> Fp8Recipe | None:
    return None if name == "bf16" else Fp8Recipe.from_name(name, check_finite=check_finite)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
