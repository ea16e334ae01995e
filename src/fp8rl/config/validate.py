"""Validation of a built RunConfig: every bad value raises ConfigError naming the dotted key,
the value and what is allowed, before anything is written. Each section checks its own fields
(`check()` beside them in config.py, the allowed values from the layers that own them); here
are the paths, the rules that read two sections, and the files a run starts from."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..rl.loss_modes import LOSS_MODES
from .model_shapes import check_model_shape
from .precision import is_quantized

if TYPE_CHECKING:
    from .sections import RunConfig


def between(key, value, lo, hi, *, lo_open=False, hi_open=False):
    ok_lo = value > lo if lo_open else value >= lo
    ok_hi = value < hi if hi_open else value <= hi
    if not (ok_lo and ok_hi):
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(key, value, f"a value in {lb}{lo}, {hi}{rb}")


def one_of(key, value, allowed):
    if value not in allowed:
        raise ConfigError(key, value, f"one of {list(allowed)}")


WANDB_MODES = ("online", "offline", "disabled")


def check_wandb(w: dict) -> None:
    unknown = sorted(set(w) - {"project", "mode"})
    if unknown:
        raise ConfigError(f"log.wandb.{unknown[0]}", w[unknown[0]], "one of the keys project, mode")
    # no project would land the run in wandb's "uncategorized": a surprise to look for later
    if not isinstance(w.get("project"), str) or not w["project"].strip():
        raise ConfigError("log.wandb.project", w.get("project"), "a W&B project name")
    if "mode" in w:
        one_of("log.wandb.mode", w["mode"], WANDB_MODES)


_UNSET_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def _path(key: str, value):
    """A path as the user means it: `~` and environment variables expanded (YAML does
    neither), relative to the current directory. Empty or space-padded paths are refused:
    "" is the current directory, and "runs/a " a folder that lists like "runs/a"."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        raise ConfigError(key, value, "a non-empty path")
    if value != value.strip():
        raise ConfigError(key, value, "a path without leading or trailing spaces")
    out = os.path.expanduser(os.path.expandvars(value))
    unset = _UNSET_VAR.search(out)
    if unset:
        raise ConfigError(key, value, f"a path whose environment variables are set ({unset[0]})")
    return out


def _expand_paths(cfg: RunConfig) -> None:
    """Every path of the config, expanded in place: the run, its saved config.json and the
    error messages all see the path used."""
    m = cfg.model
    cfg.log.out_dir = _path("log.out_dir", cfg.log.out_dir)
    if m.source != "tiny":
        m.source = _path("model.source", m.source)
    if m.init_weights is not None:
        m.init_weights = _path("model.init_weights", m.init_weights)
    if m.warm_start not in ("none", "auto"):
        m.warm_start = _path("model.warm_start", m.warm_start)
    rn = cfg.loss.ratio_noise
    if isinstance(rn, dict) and "auto" in rn:
        rn["auto"] = _path("loss.ratio_noise.auto", rn["auto"])
    for name, value in cfg.task.options.items():
        if name.endswith("_path"):  # the math task's train_path / test_path: a path or a list
            key = f"task.options.{name}"
            many = isinstance(value, list)
            paths = [_path(f"{key}[{i}]", v) for i, v in enumerate(value)] if many else None
            cfg.task.options[name] = paths if many else _path(key, value)


def validate(cfg: RunConfig) -> RunConfig:
    """Every section's own checks, in the order of the file, then what spans two sections."""
    _expand_paths(cfg)
    cfg.model.check()
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
    if cfg.calibration.upper_max is not None:
        high = cfg.loss.resolved_eps()[1]
        between("calibration.upper_max", cfg.calibration.upper_max, 1 + high, float("inf"))
    cfg.log.check()
    cfg.warm_start.check()
    _check_model_files(cfg.model)
    check_model_shape(cfg)  # after the files: it reads the checkpoint's config.json
    if cfg.rollout.engine == "vllm":  # last: it imports vLLM (seconds), or says to install it
        from ..rollout.vllm_options import check_options

        check_options(cfg.rollout.vllm)
    return cfg


def _check_model_files(m) -> None:
    """What the model starts from exists and reads as it should (the filesystem, last)."""
    if m.source != "tiny" and not Path(m.source).exists():
        raise ConfigError("model.source", m.source, "'tiny' or an existing local checkpoint folder")
    from .files import check_tiny_overrides, check_weights_file

    if m.tiny:
        check_tiny_overrides(m.tiny, "model.tiny")
    if m.warm_start not in ("none", "auto"):
        if not Path(m.warm_start).is_file():
            raise ConfigError(
                "model.warm_start", m.warm_start, "'none', 'auto' or an existing .safetensors file"
            )
        check_weights_file(m.warm_start, "model.warm_start")
        from .warmstart_file import verified_sha256

        verified_sha256(m.warm_start)
    if m.init_weights is not None:
        check_weights_file(m.init_weights, "model.init_weights")


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
