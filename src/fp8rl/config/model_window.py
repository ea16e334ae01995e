"""Sliding-window attention, refused where fp8rl would compute another model.

fp8rl's rollout and log-prob forward hand the model one full causal mask (rollout/masks.py).
A layer with a sliding window then attends further back than it was trained to, unless its
window covers the whole sequence (prompt + rollout.max_new_tokens). So:
- Gemma 2 and 3 (model_type gemma2, gemma3, gemma3_text), whose short-window layers are part
  of the architecture, are refused;
- a Mistral or Phi-3 `sliding_window`, or a Qwen2/Qwen3 one with `use_sliding_window`, is
  refused when shorter than rollout.max_new_tokens plus the task's longest prompt: from the
  config alone (a prompt has at least one token) by `validate`, from the tokenized prompts
  by `check_window_fits` once the model and task are built, before the run folder
  (the Trainer), and on every batch by the rollout engine and the log-prob forward.
A tiny MoE's `moe_intermediate_size` off the recipe's alignment is refused here too: the
dense layers' dims are model_shapes.py's, the experts' are this family's own.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..models.tiny import tiny_defaults
from ..rollout.masks import SLIDING_FAMILIES, attention_window
from ..rollout.prompts import encode_prompts
from ..tasks.base import prompt_inputs
from .precision import conversion_recipe

# tiny families with a window by default, and the config fields that set one
WINDOW_FAMILIES = ("mistral",)
WINDOW_KEYS = {"sliding_window", "use_sliding_window", "layer_types"}
MOE_FAMILIES = ("qwen3_moe",)


def check_model_window(cfg) -> None:
    """ConfigError for a model whose attention windows fp8rl cannot honour (config only)."""
    check_experts_aligned(cfg)
    config = _model_config(cfg.model)
    if config is None:
        return
    model_type = getattr(config, "model_type", None)
    if model_type in SLIDING_FAMILIES:
        raise ConfigError(
            "model.source",
            cfg.model.source,
            f"a model without sliding-window layers (config.json's model_type {model_type!r} "
            "interleaves them; fp8rl attends over the whole sequence)",
        )
    _check_fits(cfg, attention_window(config), 1)


def check_experts_aligned(cfg) -> None:
    """A MoE model's experts convert only when their intermediate size is a multiple of the
    recipe's alignment (the hidden size is checked with the dense layers, model_shapes.py):
    a run named for a recipe must run it in its experts too."""
    m = cfg.model
    if m.source != "tiny" or m.tiny.get("model_type") not in MOE_FAMILIES:
        return
    recipe = conversion_recipe(cfg.rollout.precision, cfg.train.precision)
    size = m.tiny.get("moe_intermediate_size", tiny_defaults("qwen3_moe")["moe_intermediate_size"])
    if recipe is not None and size % recipe.alignment:
        raise ConfigError(
            "model.tiny.moe_intermediate_size",
            size,
            f"a multiple of {recipe.alignment}, the alignment of recipe {recipe.name}: "
            "else every expert would stay in high precision",
        )


def check_window_fits(model, tokenizer, samples, cfg) -> None:
    """With the built model and the task's train samples, tokenized (only when the model has
    a window); the rollout engine checks each batch again."""
    window = attention_window(model.config)
    if window is not None and samples:
        vocab = model.get_input_embeddings().weight.shape[0]
        ids = encode_prompts(prompt_inputs(samples), tokenizer, vocab)  # a chat prompt's own ids
        _check_fits(cfg, window, max(len(row) for row in ids))


def _check_fits(cfg, window: int | None, longest_prompt: int) -> None:
    need = longest_prompt + cfg.rollout.max_new_tokens
    if window is None or window >= need:
        return
    what = (
        f"at least the longest prompt ({longest_prompt} tokens) + rollout.max_new_tokens "
        f"({cfg.rollout.max_new_tokens}) = {need}: fp8rl attends over the whole sequence"
    )
    m = cfg.model
    if m.source == "tiny":
        raise ConfigError("model.tiny.sliding_window", window, what)
    raise ConfigError("model.source", m.source, f"config.json's sliding_window ({window}) {what}")


def _model_config(m):
    """The model's transformers config without building it (None: a folder the loader will
    name the fault of)."""
    if m.source == "tiny":
        from ..models.tiny import tiny_config  # imports transformers: only when needed

        if m.tiny.get("model_type") not in WINDOW_FAMILIES and not WINDOW_KEYS & set(m.tiny):
            return None  # no window: spares the transformers import

        return tiny_config(**m.tiny)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            Path(m.source), local_files_only=True, trust_remote_code=False
        )
    except Exception:  # transformers raises many types; load_pretrained reports them
        return None
