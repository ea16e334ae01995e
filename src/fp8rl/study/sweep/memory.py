"""How many sweep runs fit in memory at once: `fp8rl sweep`'s default `--jobs` is
min(usable cores, jobs that fit), jobs that fit = MemAvailable // the estimated peak of the
sweep's largest run (docs/training.md, "Sweeps"). An explicit --jobs always wins.

The estimate of one run's peak resident memory, in bytes (every term float32 but the model's
own state, which is in `model.dtype`):

    RUNTIME                                    python, torch and transformers imported
  + STATE_COPIES x params x dtype bytes        weights, gradients, Adam's two moments
  + 4 x rows x (prompt + new tokens) x layers x hidden x LAYER_VECTORS   saved activations
  + 4 x rows x new tokens x vocab x LOGIT_VECTORS   logits, log-softmax, their gradients
      (both activation terms x QUANTIZED when rollout or training is quantized: the FP8
      emulation's quantized and dequantized copies)

`rows`: the rows one update's forward holds (train.micro_batch_size, or the step's rows over
train.mini_batches). The constants are calibrated against the peaks bench/sweep_memory.py
measures (docs/real-model/memory.md): the activation terms' slope matches the measured one
per row of the real model in float32, and the estimate stays above every measured peak.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...config.precision import is_quantized

RUNTIME = 3 << 28  # 0.75 GiB: a tiny run's measured peak (0.5 GiB) and a margin
STATE_COPIES = 4
PROMPT_TOKENS = 64  # a chat template's system prompt and a question
LAYER_VECTORS = 24  # hidden-size float32 vectors a token keeps per layer for the backward
LOGIT_VECTORS = 4  # vocab-size float32 vectors a response position holds at the peak
QUANTIZED = 1.5  # FP8 with Calibrated Clipping measured 1.37x float32's activations
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_shape(cfg) -> dict | None:
    """The model's config fields (vocab, hidden, layers, ...) from model.tiny or the
    checkpoint's config.json; None when unreadable."""
    m = cfg.model
    if m.source == "tiny":
        from ...models.tiny import DEFAULT_FAMILY, tiny_defaults

        family = m.tiny.get("model_type", DEFAULT_FAMILY)
        return {**tiny_defaults(family), **m.tiny}
    try:
        shape = json.loads((Path(m.source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return shape if isinstance(shape, dict) else None


def param_count(shape: dict) -> int:
    """A decoder's parameters from its config fields: embeddings (and an untied lm_head),
    attention and the MLP (or its experts) per layer; norms are left out (a rounding error)."""
    h, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    heads = shape["num_attention_heads"]
    head_dim = shape.get("head_dim") or h // heads
    kv = shape.get("num_key_value_heads") or heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    experts = shape.get("num_experts") or 0
    if experts:
        mlp = experts * 3 * h * shape["moe_intermediate_size"] + experts * h
    else:
        mlp = 3 * h * shape["intermediate_size"]
    tied = shape.get("tie_word_embeddings", False)
    return vocab * h * (1 if tied else 2) + layers * (attention + mlp)


def peak_estimate(cfg) -> int | None:
    """One run's estimated peak resident memory in bytes (module doc); None when the model's
    shape cannot be read."""
    shape = model_shape(cfg)
    try:
        params = param_count(shape) if shape is not None else None
    except (KeyError, TypeError):
        params = None
    if params is None:
        return None
    r, t = cfg.rollout, cfg.train
    rows = t.micro_batch_size or math.ceil(r.prompts_per_step * r.n / t.mini_batches)
    layers = rows * (PROMPT_TOKENS + r.max_new_tokens) * shape["num_hidden_layers"]
    activations = layers * shape["hidden_size"] * LAYER_VECTORS
    logits = rows * r.max_new_tokens * shape["vocab_size"] * LOGIT_VECTORS
    state = STATE_COPIES * params * DTYPE_BYTES.get(cfg.model.dtype, 4)
    quantized = is_quantized(r.precision) or is_quantized(t.precision)
    return RUNTIME + state + int(4 * (activations + logits) * (QUANTIZED if quantized else 1))


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes; None where /proc/meminfo is missing or has no such line."""
    try:
        text = Path(meminfo).read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024  # kB
    return None


def default_jobs(cores: int, available: int | None, peak: int | None) -> tuple[int, str]:
    """(jobs, why): min(cores, available // peak), at least 1; the cores where either
    figure is unknown."""
    gib = 1 << 30
    if available is None or peak is None:
        what = "available memory" if available is None else "the runs' peak memory"
        return cores, f"{cores} usable core(s); {what} unknown"
    fit = max(1, available // peak)
    why = (
        f"{cores} usable core(s), {available / gib:.1f} GiB available / "
        f"{peak / gib:.1f} GiB estimated per run = {available // peak} that fit"
    )
    if available < peak:
        why += "; one at a time anyway"
    return min(cores, fit), why


def sweep_default_jobs(configs, cores: int, available: int | None) -> tuple[int, str]:
    """default_jobs for the sweep's run configs, sized by its largest run."""
    peaks = [peak_estimate(cfg) for cfg in configs]
    peak = None if not peaks or None in peaks else max(peaks)
    return default_jobs(cores, available, peak)
