"""What the Trainer builds from a config before its first step: the policy model and its
tokenizer, the device, the optimizer, the rollout engine, the calibration state, the
ablation's noise, and the step plan."""

from __future__ import annotations

import torch

from ..config import RunConfig
from ..config.files import read_noise_calibration
from ..errors import ConfigError
from ..models import tiny_model
from ..rl.calibration_state import CalibrationState

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """The run's AdamW (built again after FSDP2 has sharded the parameters)."""
    tc = cfg.train
    return torch.optim.AdamW(
        model.parameters(), lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay
    )


def resolve_ratio_noise(cfg: RunConfig) -> tuple[float, float] | None:
    """loss.ratio_noise as (sd, corr); `auto: RUN_DIR` reads an FP8 run's shadow statistics."""
    rn = cfg.loss.ratio_noise
    if rn is None:
        return None
    if "auto" in rn:
        return read_noise_calibration(rn["auto"])
    return float(rn["sd"]), float(rn["corr"])


def build_vllm_engine(cfg: RunConfig, model, tokenizer, recipe):
    """rollout.engine=vllm: a colocated vllm.LLM built from the trainer's model."""
    from ..rollout.vllm_engine import VllmRolloutEngine

    rc = cfg.rollout
    return VllmRolloutEngine(
        model,
        tokenizer,
        recipe=recipe,
        options=rc.vllm,
        seed=cfg.train.seed,
        sync_every=rc.sync_every,
    )


def calibration_state(cfg: RunConfig) -> CalibrationState:
    """The whole `calibration` section, so checkpoints record the settings the run used, and
    the loss's bounds and shadow cadence: the state answers both for the step."""
    return CalibrationState.from_config(
        cfg.calibration,
        eps=cfg.loss.resolved_eps(),
        source=cfg.loss.table.bounds,
        level=cfg.loss.table.level,
        relaxed_lower=cfg.loss.relaxed_lower,
        shadow_passes=cfg.shadow_passes,
        seed=cfg.train.seed,
    )


def device_of(name: str) -> torch.device:
    """model.device as a torch device (auto: CUDA when there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device", name, "'cpu' or 'auto' (no CUDA device is available)")
    return torch.device(name)


def build_model(mcfg, task, device: torch.device):
    """The policy model and its tokenizer, from a tiny config or a local checkpoint."""
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
