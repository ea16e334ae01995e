"""Validation of a built RunConfig: every bad value raises ConfigError naming the dotted key,
the value and what is allowed, before anything is written. Each section checks its own fields
(`check()` beside them in sections.py, the allowed values from the layers that own them); here
are the rules that read two sections, called in order with the paths (files.py) first and the
files a run starts from last."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..rl.calibration import RULES
from ..rl.loss_modes import LOSS_MODES, RatioLevel
from .checks import between
from .files import check_model_files, expand_paths
from .model_shapes import check_model_shape, check_tiny_fields
from .model_window import check_model_window
from .precision import is_quantized

if TYPE_CHECKING:
    from .sections import RunConfig


def validate(cfg: RunConfig) -> RunConfig:
    """Every section's own checks, in the order of the file, then what spans two sections."""
    expand_paths(cfg)
    cfg.model.check()
    cfg.task.check()
    cfg.rollout.check()
    cfg.train.check()
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n
    if cfg.train.mini_batches > batch:
        raise ConfigError(
            "train.mini_batches", cfg.train.mini_batches, f"at most the batch size {batch}"
        )
    cfg.loss.check()
    between("loss.overlong_buffer", cfg.loss.overlong_buffer, 0, cfg.rollout.max_new_tokens - 1)
    _check_ablations(cfg)
    cfg.calibration.check()
    rule = cfg.calibration.rule
    if RULES[rule].noise_scaled_caps and cfg.loss.table.level is RatioLevel.SEQUENCE:
        # its reference noise is a token's log-ratio error; a response's is another scale
        others = [n for n, row in RULES.items() if not row.noise_scaled_caps]
        need = f"one of {others} with loss.mode={cfg.loss.mode} (sequence ratios)"
        raise ConfigError("calibration.rule", rule, need)
    if cfg.calibration.upper_max is not None:
        high = cfg.loss.resolved_eps()[1]
        between("calibration.upper_max", cfg.calibration.upper_max, 1 + high, float("inf"))
    cfg.log.check()
    _check_effects(cfg)
    cfg.warm_start.check()
    check_model_files(cfg.model)
    if cfg.model.source == "tiny":  # after the files: their types are checked there
        check_tiny_fields(cfg.model.tiny)
    check_model_window(cfg)  # after the files: it reads model.tiny or config.json
    check_model_shape(cfg)  # after the files: it reads the checkpoint's config.json
    if cfg.rollout.engine == "vllm":  # last: it imports vLLM (seconds), or says to install it
        from ..rollout.vllm_options import check_options

        check_options(cfg.rollout.vllm)
    return cfg


ORACLE_LOSSES = ("ppo_clip",)  # the clipped surrogate: a clip decision to take from BF16


def _check_ablations(cfg: RunConfig) -> None:
    lc = cfg.loss
    if lc.clip_source == "bf16":
        if lc.table.loss not in ORACLE_LOSSES:
            modes = [m for m, row in LOSS_MODES.items() if row.loss in ORACLE_LOSSES]
            raise ConfigError(
                "loss.clip_source", "bf16", f"a PPO-clip loss.mode ({', '.join(modes)})"
            )
        if lc.dual_clip is not None:
            raise ConfigError("loss.dual_clip", lc.dual_clip, "null with loss.clip_source=bf16")
        every = cfg.calibration.shadow_every or cfg.calibration.interval
        if not cfg.shadow_passes or every != 1:
            raise ConfigError(
                "loss.clip_source",
                "bf16",
                "shadow passes every step (calibration.diagnostics=true or loss.mode=calibrated, "
                "and calibration.shadow_every=1)",
            )
    rn = lc.ratio_noise
    if rn is None:
        return
    if lc.clip_source == "bf16":
        raise ConfigError(
            "loss.ratio_noise", rn, "null with loss.clip_source=bf16 (one ablation a run)"
        )
    if set(rn) == {"auto"}:
        if not isinstance(rn["auto"], str) or not (Path(rn["auto"]) / "metrics.jsonl").is_file():
            raise ConfigError(
                "loss.ratio_noise.auto", rn["auto"], "a run folder with metrics.jsonl"
            )
    elif set(rn) == {"sd", "corr"}:
        for k, lo, hi in (("sd", 0.0, 10.0), ("corr", -1.0, 1.0)):
            v = rn[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"loss.ratio_noise.{k}", v, "a number")
            between(f"loss.ratio_noise.{k}", v, lo, hi)
    else:
        raise ConfigError("loss.ratio_noise", rn, "null, {sd: S, corr: C} or {auto: RUN_DIR}")
    if is_quantized(cfg.train.precision):
        raise ConfigError(
            "loss.ratio_noise",
            rn,
            "null in a quantized run (it models quantization noise for bf16/fp32 training)",
        )


def check_extras(cfg: RunConfig) -> None:
    """The optional packages the config's options need, installed: checked where a run starts
    (the Trainer, before the model and the run folder), not at validation, so that a config
    for another machine (configs/math-qwen3-8b.yaml logs to TensorBoard) still loads."""
    if cfg.log.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "log.tensorboard", True, "false, or `pip install fp8rl[tensorboard]` first"
        )
    if cfg.log.wandb is not None and importlib.util.find_spec("wandb") is None:
        raise ConfigError("log.wandb", cfg.log.wandb, "null, or `pip install fp8rl[wandb]` first")


def _check_effects(cfg: RunConfig) -> None:
    """Values that validate one by one but make the run do nothing: a factor that skips every
    update, an evaluation of nothing, a warm-start cache with no home."""
    if not math.isfinite(cfg.loss.overlong_factor):
        # an infinite penalty makes a too-long response's loss non-finite: its update skipped
        raise ConfigError("loss.overlong_factor", cfg.loss.overlong_factor, "a finite number >= 0")
    if cfg.log.eval_every and not cfg.log.eval_size:
        raise ConfigError(
            "log.eval_every",
            cfg.log.eval_every,
            "0 when log.eval_size = 0 (it evaluates log.eval_size test problems: none)",
        )
    if cfg.model.warm_start == "auto" and not cfg.model.init_weights:
        if not (os.environ.get("FP8RL_CACHE") or os.environ.get("HOME")):
            raise ConfigError(
                "model.warm_start",
                "auto",
                "'none' or a file while neither FP8RL_CACHE nor HOME is set: the cache of "
                "built warm starts is $FP8RL_CACHE, else $HOME/.cache/fp8rl",
            )
