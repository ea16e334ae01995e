"""The model's shape against the precision recipe, checked before anything is written.

`convert_to_fp8` converts a linear layer only when both its dims are multiples of the recipe's
alignment (`Fp8Recipe.alignment`: 16 tensorwise, rowwise and blockwise, whose ragged edge
blocks have scales of their own; 32 mxfp8, mxfp4 and nvfp4); any other layer silently stays in
high precision. A run named for a recipe must run it, so for the dense decoders whose layers
fp8rl knows (the tiny Qwen3, and checkpoints of the types below) a dim that keeps any
projection out is a ConfigError naming the `model.*` key. lm_head is the one layer kept on
purpose (`fp8.convert.ALWAYS_SKIPPED`); embeddings and norms are no linear layers. Other
architectures are checked once built (`check_built_model`): no convertible layer is an error,
some kept ones a warning, as fp8rl cannot tell which of their layers (a router, say) are meant
to stay in high precision.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from ..errors import ConfigError
from ..fp8 import Fp8Recipe
from ..fp8.convert import ALWAYS_SKIPPED
from .precision import RECIPE_OF_PRECISION, conversion_recipe

# config.json model types whose layers are q/k/v/o_proj and gate/up/down_proj as dims_of says
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_MLP = ("gate_proj", "up_proj", "down_proj")
_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", *_MLP)


@dataclass(frozen=True)
class Dim:
    """One dim of the model's linear layers: the config fields whose product it is, and the
    layers it is an input or output dim of."""

    fields: tuple[str, ...]
    layers: tuple[str, ...]

    def value(self, shape: dict) -> int:
        return math.prod(shape[f] for f in self.fields)

    def text(self, shape: dict) -> str:
        """'hidden_size (48)', 'num_key_value_heads x head_dim (1 x 32 = 32)'."""
        if len(self.fields) == 1:
            return f"{self.fields[0]} ({self.value(shape)})"
        product = " x ".join(str(shape[f]) for f in self.fields)
        return f"{' x '.join(self.fields)} ({product} = {self.value(shape)})"


DIMS = (
    Dim(("hidden_size",), _ALL),
    Dim(("intermediate_size",), _MLP),
    Dim(("num_attention_heads", "head_dim"), ("q_proj", "o_proj")),
    Dim(("num_key_value_heads", "head_dim"), ("k_proj", "v_proj")),
)


def resolved(shape: dict) -> dict:
    """The config fields with the defaults of the model code: Llama and Qwen2 leave head_dim
    (hidden / heads) and num_key_value_heads (heads) out."""
    heads = shape["num_attention_heads"]
    return {
        **shape,
        "head_dim": shape.get("head_dim") or shape["hidden_size"] // heads,
        "num_key_value_heads": shape.get("num_key_value_heads") or heads,
    }


def check_model_shape(cfg) -> None:
    """ConfigError when the recipe the model is converted against would keep a projection in
    high precision. A checkpoint without a readable config.json of a known type is left to
    `check_built_model` (and its loader's own errors)."""
    recipe = conversion_recipe(cfg.rollout.precision, cfg.train.precision)
    if recipe is None:
        return
    m = cfg.model
    if m.source == "tiny":
        from ..models.tiny import TINY_DEFAULTS

        shape = resolved({**TINY_DEFAULTS, **m.tiny})
        bad = _bad_dims(shape, recipe)
        if bad:
            # the key: the field of the dim the config sets (head_dim when it sets neither)
            first = bad[0]
            name = next((f for f in reversed(first.fields) if f in m.tiny), first.fields[-1])
            what = "" if first.fields == (name,) else f"{first.text(shape)} to be "
            raise ConfigError(f"model.tiny.{name}", shape[name], what + _need(bad, recipe, cfg))
        return
    shape = _checkpoint_shape(Path(m.source))
    bad = [] if shape is None else _bad_dims(shape, recipe)
    if bad:
        what = f"config.json's {bad[0].text(shape)} to be "
        raise ConfigError("model.source", m.source, what + _need(bad, recipe, cfg))


def _checkpoint_shape(folder: Path) -> dict | None:
    try:
        shape = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # load_pretrained names what is wrong with the folder
    if not isinstance(shape, dict) or shape.get("model_type") not in DENSE_TYPES:
        return None
    fields = ("hidden_size", "intermediate_size", "num_attention_heads")
    if not all(isinstance(shape.get(f), int) and shape[f] > 0 for f in fields):
        return None
    return resolved(shape)


def _bad_dims(shape: dict, recipe: Fp8Recipe) -> list[Dim]:
    return [d for d in DIMS if d.value(shape) % recipe.alignment]


def _need(bad: list[Dim], recipe: Fp8Recipe, cfg) -> str:
    """The alignment, whose it is, and what the bad dims cost: the layers they keep out."""
    kept = [layer for layer in _ALL if any(layer in d.layers for d in bad)]
    which = "every projection" if len(kept) == len(_ALL) else ", ".join(kept)
    return (
        f"a multiple of {recipe.alignment}, the alignment of {_recipe_text(recipe, cfg)}: "
        f"else {which} would stay in high precision"
    )


def _recipe_text(recipe: Fp8Recipe, cfg) -> str:
    """'recipe mxfp8 (rollout.precision=mxfp8, train.precision=mxfp8)': the phases using it."""
    phases = [
        f"{k}={p}"
        for k, p in (
            ("rollout.precision", cfg.rollout.precision),
            ("train.precision", cfg.train.precision),
        )
        if RECIPE_OF_PRECISION.get(p) == recipe.name
    ]
    return f"recipe {recipe.name} ({', '.join(phases)})"


def _linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linear layers a recipe is meant to convert: all but lm_head."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] not in ALWAYS_SKIPPED
    ]


def check_built_model(model: nn.Module, cfg) -> str | None:
    """For a built model of any architecture: ConfigError when no linear layer but lm_head
    converts; the warning to give when some stay in high precision; else None."""
    recipe = conversion_recipe(cfg.rollout.precision, cfg.train.precision)
    if recipe is None:
        return None
    a, linears = recipe.alignment, _linears(model)
    kept = [
        f"{name} ({mod.in_features} -> {mod.out_features})"
        for name, mod in linears
        if mod.in_features % a or mod.out_features % a
    ]
    if not kept:
        return None
    what = f"multiples of {a}, the alignment of {_recipe_text(recipe, cfg)}"
    if len(kept) == len(linears):
        raise ConfigError(
            "model.source",
            cfg.model.source,
            f"a model with linear layers whose dims are {what}: none is (e.g. {kept[0]})",
        )
    return (
        f"{len(kept)} of {len(linears)} linear layers of model.source stay in high precision, "
        f"their dims not {what} (e.g. {kept[0]}; all in fp8_conversion.txt)"
    )


# ---------------------------------------------------------------- the model's other fields
# What the model code would otherwise fail on (a KeyError building the MLP, a view error in
# attention, a RoPE table of odd width) or run silently wrong (dropout in the log-probs).


def check_tiny_fields(tiny: dict, key: str = "model.tiny") -> None:
    """At validation: fp8rl's own rules first (their words name what is allowed), then
    transformers' validation of the config the tiny model is built from (types, RoPE)."""
    from transformers.activations import ACT2FN

    from ..models.tiny import DEFAULT_FAMILY, tiny_config, tiny_defaults

    family = tiny.get("model_type", DEFAULT_FAMILY)  # a known one: check_tiny_overrides
    fields = {k: v for k, v in tiny.items() if k != "model_type"}
    shape = {**tiny_defaults(family), **fields}

    def refuse(name: str, allowed: str):
        raise ConfigError(f"{key}.{name}", shape.get(name), allowed)

    act = shape.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in ACT2FN:
        refuse("hidden_act", f"an activation transformers knows (ACT2FN): {sorted(ACT2FN)}")
    p = shape.get("attention_dropout", 0.0)
    if isinstance(p, (int, float)) and not isinstance(p, bool) and not 0 <= p < 1:
        refuse("attention_dropout", "a probability in [0, 1)")
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    if heads % kv:
        # the field the config sets: the query heads are shared out among the KV heads
        name = "num_key_value_heads" if "num_key_value_heads" in tiny else "num_attention_heads"
        refuse(name, f"num_attention_heads ({heads}) divisible by num_key_value_heads ({kv})")
    if shape["head_dim"] % 2:
        refuse("head_dim", "an even number: RoPE rotates the head's dims in pairs")
    try:
        tiny_config(family, **fields).validate()
    except Exception as e:  # huggingface_hub's StrictDataclassError and the config's own
        text = " ".join(str(e).split())
        named = re.search(r"field '(\w+)'|`(\w+)`", text)
        name = next((g for g in named.groups() if g), None) if named else None
        where = f"{key}.{name}" if name in shape else key
        value = shape[name] if name in shape else tiny
        raise ConfigError(where, value, f"a value transformers accepts ({text})") from e


def check_positions(cfg, samples, tokenizer, model) -> None:
    """ConfigError when a prompt of `samples` plus rollout.max_new_tokens would pass the
    model's max_position_embeddings, where RoPE reads past the range the model knows (the
    engine's own check would stop the run mid-way). Needs the prompts tokenized: the Trainer
    calls it before the warm start and the run folder."""
    from ..rollout.prompts import encode_prompts
    from ..tasks.base import prompt_inputs

    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None or not samples or tokenizer is None:
        return
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = encode_prompts(prompt_inputs(samples), tokenizer, vocab)  # a chat prompt's own ids
    longest, new = max(len(x) for x in ids), cfg.rollout.max_new_tokens
    if longest + new <= limit:
        return
    if cfg.model.source == "tiny":
        raise ConfigError(
            "model.tiny.max_position_embeddings",
            limit,
            f"at least the longest prompt ({longest} tokens) plus rollout.max_new_tokens "
            f"({new}) = {longest + new}",
        )
    raise ConfigError(
        "rollout.max_new_tokens",
        new,
        f"at most {max(limit - longest, 0)}: the longest prompt takes {longest} of the "
        f"model's max_position_embeddings = {limit}",
    )
