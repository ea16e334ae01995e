"""Validation of a built RunConfig: every bad value raises ConfigError naming the dotted key,
the value and what is allowed, before anything is written. The allowed values come from the
layers that own them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..rl.advantages import ADVANTAGE_KINDS
from ..rl.aggregation import AGGREGATIONS
from ..rl.calibration import RULES as CALIBRATION_RULES
from ..rl.loss_modes import LOSS_MODES
from ..rl.tis import TIS_LEVELS, TIS_MODES
from .precision import PRECISIONS

if TYPE_CHECKING:
    from .config import RunConfig


def _between(key, value, lo, hi, *, lo_open=False, hi_open=False):
    ok_lo = value > lo if lo_open else value >= lo
    ok_hi = value < hi if hi_open else value <= hi
    if not (ok_lo and ok_hi):
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(key, value, f"a value in {lb}{lo}, {hi}{rb}")


def _one_of(key, value, allowed):
    if value not in allowed:
        raise ConfigError(key, value, f"one of {list(allowed)}")


WANDB_MODES = ("online", "offline", "disabled")


def _check_wandb(w: dict) -> None:
    unknown = sorted(set(w) - {"project", "mode"})
    if unknown:
        raise ConfigError(f"log.wandb.{unknown[0]}", w[unknown[0]], "one of the keys project, mode")
    # no project would land the run in wandb's "uncategorized": a surprise to look for later
    if not isinstance(w.get("project"), str) or not w["project"].strip():
        raise ConfigError("log.wandb.project", w.get("project"), "a W&B project name")
    if "mode" in w:
        _one_of("log.wandb.mode", w["mode"], WANDB_MODES)


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
    inf = float("inf")
    _expand_paths(cfg)
    _one_of("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
    _one_of("model.device", cfg.model.device, ("auto", "cpu", "cuda"))
    _one_of("rollout.precision", cfg.rollout.precision, PRECISIONS)
    _one_of("train.precision", cfg.train.precision, PRECISIONS)
    _between("rollout.prompts_per_step", cfg.rollout.prompts_per_step, 1, 1 << 20)
    _between("rollout.n", cfg.rollout.n, 1, 1024)
    _between("rollout.temperature", cfg.rollout.temperature, 0.0, 10.0, lo_open=True)
    _between("rollout.top_p", cfg.rollout.top_p, 0.0, 1.0, lo_open=True)
    _between("rollout.max_new_tokens", cfg.rollout.max_new_tokens, 1, 1 << 20)
    _between("train.steps", cfg.train.steps, 0, 1 << 30)
    # numpy's and torch's generators take seeds >= 0; checked here, before any run folder
    _between("train.seed", cfg.train.seed, 0, (1 << 63) - 1)
    _between("train.lr", cfg.train.lr, 0.0, 1.0, lo_open=True)
    _between("train.weight_decay", cfg.train.weight_decay, 0.0, 1.0)
    _between("train.grad_clip", cfg.train.grad_clip, 0.0, inf)
    if len(cfg.train.betas) != 2 or not all(0 <= b < 1 for b in cfg.train.betas):
        raise ConfigError("train.betas", list(cfg.train.betas), "two numbers in [0, 1)")
    _between("train.mini_batches", cfg.train.mini_batches, 1, 1 << 30)
    _between("train.micro_batch_size", cfg.train.micro_batch_size, 0, 1 << 20)
    _between("train.logprob_micro_batch_size", cfg.train.logprob_micro_batch_size, 0, 1 << 20)
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n
    if cfg.train.mini_batches > batch:
        raise ConfigError(
            "train.mini_batches", cfg.train.mini_batches, f"at most the batch size {batch}"
        )
    _one_of("loss.mode", cfg.loss.mode, tuple(LOSS_MODES))
    low, high = cfg.loss.resolved_eps()
    _between("loss.eps_low", low, 0.0, 1.0, lo_open=True, hi_open=True)
    _between("loss.eps_high", high, 0.0, 10.0, lo_open=True)
    _one_of("loss.agg", cfg.loss.resolved_agg(), AGGREGATIONS)
    _one_of("loss.advantage", cfg.loss.advantage, ADVANTAGE_KINDS)
    if cfg.loss.dual_clip is not None:
        _between("loss.dual_clip", cfg.loss.dual_clip, 1.0, inf, lo_open=True)
    _between("loss.relaxed_lower", cfg.loss.relaxed_lower, 0.0, 1.0, lo_open=True, hi_open=True)
    _between("loss.overlong_buffer", cfg.loss.overlong_buffer, 0, cfg.rollout.max_new_tokens - 1)
    _between("loss.overlong_factor", cfg.loss.overlong_factor, 0.0, inf)
    _one_of("loss.tis_level", cfg.loss.tis_level, TIS_LEVELS)
    _one_of("loss.tis_mode", cfg.loss.tis_mode, TIS_MODES)
    _between("loss.tis_cap", cfg.loss.tis_cap, 1.0, inf)
    _between("loss.bapo_target", cfg.loss.bapo_target, 0.0, 1.0, lo_open=True, hi_open=True)
    _check_ablations(cfg)
    cc = cfg.calibration
    _one_of("calibration.rule", cc.rule, CALIBRATION_RULES)
    _between("calibration.interval", cc.interval, 1, 1 << 20)
    if cc.shadow_every is not None:
        _between("calibration.shadow_every", cc.shadow_every, 1, 1 << 20)
        if cc.interval % cc.shadow_every:
            raise ConfigError(
                "calibration.interval",
                cc.interval,
                f"a multiple of calibration.shadow_every ({cc.shadow_every})",
            )
    _between("calibration.pool_window", cc.pool_window, 1, 1 << 20)
    _between("calibration.pool_min_clips", cc.pool_min_clips, 1, 1 << 30)
    _between("calibration.pool_max_tokens", cc.pool_max_tokens, 1, 1 << 40)
    _between("calibration.lower_min", cc.lower_min, 0.0, 1.0, lo_open=True, hi_open=True)
    if cc.upper_max is not None:
        _between("calibration.upper_max", cc.upper_max, 1 + high, inf)
    _between("calibration.max_step_lower", cfg.calibration.max_step_lower, 0.0, 1.0, lo_open=True)
    _between("calibration.max_step_upper", cfg.calibration.max_step_upper, 0.0, 10.0, lo_open=True)
    _between("calibration.min_tokens", cfg.calibration.min_tokens, 1, 1 << 30)
    _between(
        "calibration.entropy_surge_factor",
        cfg.calibration.entropy_surge_factor,
        1.0,
        inf,
        lo_open=True,
    )
    _between("calibration.entropy_surge_window", cfg.calibration.entropy_surge_window, 2, 1 << 20)
    _between("log.checkpoint_every", cfg.log.checkpoint_every, 0, 1 << 30)
    _between("log.keep_last", cfg.log.keep_last, 1, 1000)
    _between("log.eval_every", cfg.log.eval_every, 0, 1 << 30)
    _between("log.eval_size", cfg.log.eval_size, 0, 1 << 20)
    if cfg.log.wandb is not None:
        _check_wandb(cfg.log.wandb)
    if cfg.model.source != "tiny" and not Path(cfg.model.source).exists():
        raise ConfigError(
            "model.source", cfg.model.source, "'tiny' or an existing local checkpoint folder"
        )
    if cfg.model.tiny:
        from .model_setup import check_tiny_overrides

        check_tiny_overrides(cfg.model.tiny, "model.tiny")
    ws = cfg.warm_start
    _between("warm_start.steps", ws.steps, 1, 1 << 30)
    _between("warm_start.batch_size", ws.batch_size, 1, 1 << 20)
    _between("warm_start.lr", ws.lr, 0.0, 1.0, lo_open=True)
    _between("warm_start.target_accuracy", ws.target_accuracy, 0.0, 1.0)
    _between("warm_start.check_every", ws.check_every, 1, 1 << 30)
    _between("warm_start.seed", ws.seed, 0, (1 << 63) - 1)
    if cfg.model.warm_start not in ("none", "auto"):
        if not Path(cfg.model.warm_start).is_file():
            raise ConfigError(
                "model.warm_start",
                cfg.model.warm_start,
                "'none', 'auto' or an existing .safetensors file",
            )
        from .model_setup import check_weights_file

        check_weights_file(cfg.model.warm_start, "model.warm_start")
    if cfg.model.init_weights is not None:
        from .model_setup import check_weights_file

        check_weights_file(cfg.model.init_weights, "model.init_weights")
    return cfg


ORACLE_LOSSES = ("ppo_clip",)  # the clipped surrogate: a clip decision to take from BF16


def _check_ablations(cfg: RunConfig) -> None:
    lc = cfg.loss
    _one_of("loss.clip_source", lc.clip_source, ("fp8", "bf16"))
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
            _between(f"loss.ratio_noise.{k}", v, lo, hi)
    else:
        raise ConfigError("loss.ratio_noise", rn, "null, {sd: S, corr: C} or {auto: RUN_DIR}")
    if cfg.train.precision.startswith("fp8"):
        raise ConfigError(
            "loss.ratio_noise",
            rn,
            "null in an FP8 run (it models FP8 noise for bf16/fp32 training)",
        )
