"""The policy model and its tokenizer, from a tiny config or a local checkpoint."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..models import tiny_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(mcfg, task, device: torch.device):
    dtype = DTYPES[mcfg.dtype]
    if mcfg.source == "tiny":
        tokenizer = getattr(task, "tokenizer", None)
        if tokenizer is None:
            raise ConfigError(
                "model.source",
                "tiny",
                f"a checkpoint folder: task '{task.name}' has no tokenizer of its own",
            )
        model = tiny_model(vocab_size=len(tokenizer), dtype=dtype, **mcfg.tiny)
    else:
        from ..models import load_pretrained

        model, tokenizer = load_pretrained(mcfg.source, dtype=dtype)
        if getattr(task, "tokenizer", None) is None:
            # the model's own tokenizer: its EOS lists stay as declared (a chat model's
            # generation config often lists end of turn and end of text; the engine stops at
            # each), only a missing pad id is filled in
            if getattr(model.config, "pad_token_id", None) is None:
                model.config.pad_token_id = tokenizer.pad_token_id
            return model.to(device), tokenizer
        tokenizer = task.tokenizer
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            setattr(model.config, name, value)
            if getattr(model, "generation_config", None) is not None:
                setattr(model.generation_config, name, value)
    return model.to(device), tokenizer
