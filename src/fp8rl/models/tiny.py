"""Tiny randomly initialised decoders built from `transformers`' own config classes: no
downloads. A Qwen3 by default; `model_type` picks another family users train."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

# Every linear dim is a multiple of 128 so that tensorwise, rowwise and blockwise
# (128x128 weight blocks) recipes all convert every projection.
TINY_DEFAULTS = dict(
    vocab_size=64,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)

DEFAULT_FAMILY = "qwen3"
# config.json model types fp8rl runs at every stage (docs/training.md, "Model families")
FAMILIES = ("qwen3", "llama", "qwen2", "qwen3_moe", "mistral", "phi3", "gemma")
# Special ids come from the tokenizer (train/build.py); the config classes' own ones
# (Phi-3's pad 32000) would fall outside a tiny vocabulary and give the embedding a pad row.
_NO_SPECIAL_IDS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)
_FAMILY_DEFAULTS = {
    # 4 experts, 2 per token, every layer sparse; 128 keeps blockwise conversion possible
    "qwen3_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, decoder_sparse_step=1
    ),
}


def check_family(model_type: str) -> None:
    if model_type not in FAMILIES:
        raise ValueError(f"tiny model: model_type {model_type!r} is not one of {FAMILIES}")


def tiny_defaults(model_type: str = DEFAULT_FAMILY) -> dict:
    """The fields fp8rl sets for a tiny model of this family (overrides win over them)."""
    check_family(model_type)
    return {**TINY_DEFAULTS, **_NO_SPECIAL_IDS, **_FAMILY_DEFAULTS.get(model_type, {})}


def config_fields(model_type: str = DEFAULT_FAMILY) -> dict:
    """The family's config class fields with their default values."""
    from transformers import CONFIG_MAPPING

    check_family(model_type)
    return CONFIG_MAPPING[model_type]().to_dict()


def tiny_config(model_type: str = DEFAULT_FAMILY, **overrides) -> PretrainedConfig:
    # imported here: transformers' model classes take seconds and pull in torchao
    from transformers import CONFIG_MAPPING

    defaults = tiny_defaults(model_type)
    fields = config_fields(model_type)
    unknown = [k for k in overrides if k not in fields and k not in defaults]
    if unknown:
        raise ValueError(f"tiny {model_type}: unknown config field(s) {unknown}")
    cfg = CONFIG_MAPPING[model_type](**{**defaults, **overrides})
    cfg._attn_implementation = "sdpa"
    return cfg


def tiny_model(
    model_type: str = DEFAULT_FAMILY,
    *,
    seed: int | None = 0,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> PreTrainedModel:
    """A tiny causal LM of the family (about 0.8M parameters for the default Qwen3)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type, **overrides)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg)
    else:
        model = AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype)


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    return tiny_config("qwen3", **overrides)


def tiny_qwen3(
    *, seed: int | None = 0, dtype: torch.dtype = torch.float32, **overrides
) -> Qwen3ForCausalLM:
    """A tiny Qwen3 (about 0.8M parameters by default) for CPU tests and the demo."""
    return tiny_model("qwen3", seed=seed, dtype=dtype, **overrides)
