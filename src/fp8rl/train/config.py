"""Run configuration: frozen-by-convention dataclasses, YAML files and `key=value` overrides.

Every bad value raises `ConfigError` naming the dotted key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..rl.advantages import ADVANTAGE_KINDS
from ..rl.aggregation import AGGREGATIONS
from ..rl.calibration import RULES as CALIBRATION_RULES
from ..rl.loss_modes import LOSS_MODES
from ..rl.tis import TIS_LEVELS, TIS_MODES
from .precision import PRECISIONS


@dataclass
class ModelConfig:
    source: str = "tiny"  # "tiny" (random Qwen3 from a config) or a local HF checkpoint folder
    tiny: dict = field(default_factory=dict)  # overrides for fp8rl.models.tiny_qwen3
    init_weights: str | None = None  # a safetensors file to start from; wins over warm_start
    # none | auto (the cached supervised warm start of this task and model, built if missing:
    # train/warmstart.py, settings in the warm_start section) | a safetensors file
    warm_start: str = "none"
    dtype: str = "float32"  # master weights: float32 or bfloat16
    device: str = "auto"  # auto | cpu | cuda


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    options: dict = field(default_factory=dict)  # passed to fp8rl.tasks.get_task


@dataclass
class RolloutConfig:
    precision: str = "fp8-rowwise"
    prompts_per_step: int = 32
    n: int = 8  # samples per prompt (the GRPO group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16


@dataclass
class TrainConfig:
    precision: str = "fp8-rowwise"
    steps: int = 100
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    grad_clip: float = 1.0
    mini_batches: int = 4  # optimizer updates per step: what moves the ratio off 1
    micro_batch_size: int = 0  # 0: a whole mini-batch per forward
    logprob_micro_batch_size: int = 0  # old log-probs and shadow passes; 0: whole batch
    seed: int = 0
    # Locate non-finite values (events.log names the FP8 layer and tensor, and the parameters
    # with non-finite gradients); on CUDA each FP8 check is a host sync. On or off, a
    # non-finite loss, gradient or FP8 input skips the update and never stops the run.
    fp8_check_finite: bool = True


@dataclass
class LossConfig:
    mode: str = "grpo"  # a key of rl.loss_modes.LOSS_MODES
    eps_low: float | None = None  # None: 0.2
    eps_high: float | None = None  # None: the mode's default (0.28 for dapo, else 0.2)
    agg: str | None = None  # None: the mode's default (token-mean for dapo)
    advantage: str = "grpo"  # grpo | drgrpo
    dual_clip: float | None = None
    relaxed_lower: float = 0.6  # relax_lower mode's fixed lower bound
    dynamic_sampling: bool | None = None  # None: the mode's default (on for dapo)
    overlong_buffer: int = 0  # DAPO overlong shaping; 0 disables
    overlong_factor: float = 1.0
    tis: bool = True
    tis_level: str = "token"
    tis_mode: str = "truncate"
    tis_cap: float = 2.0
    bapo_target: float = 0.5
    # Ablations (docs/study.md). clip_source: the ratio the clip decision reads: fp8 (the
    # training ratio) | bf16 (oracle clipping: the BF16 shadow's; needs shadow passes every
    # step). ratio_noise: {sd, corr} or {auto: RUN_DIR}: Gaussian errors on the trainer's
    # old and new log-probs of a high-precision run, a model of FP8's (docs/rl.md).
    clip_source: str = "fp8"
    ratio_noise: dict | None = None

    @property
    def table(self):
        """This mode's row of the loss-mode table (after validation)."""
        return LOSS_MODES[self.mode]

    def resolved_eps(self) -> tuple[float, float]:
        low = 0.2 if self.eps_low is None else self.eps_low
        high = self.table.eps_high if self.eps_high is None else self.eps_high
        return low, high

    def resolved_agg(self) -> str:
        return self.table.agg if self.agg is None else self.agg

    def resolved_dynamic_sampling(self) -> bool:
        return (
            self.table.dynamic_sampling if self.dynamic_sampling is None else self.dynamic_sampling
        )


@dataclass
class CalibrationConfig:
    diagnostics: bool = False  # shadow passes without touching the bounds (study vanilla FP8)
    rule: str = "pooled"  # pooled | paper (docs/rl.md)
    interval: int = 20  # bounds are refit every `interval` steps
    shadow_every: int | None = None  # the BF16 shadow passes; None: every `interval` steps
    pool_window: int = 5  # pooled: at most this many shadow steps per refit ...
    pool_min_clips: int = 20  # ... fewer once they hold this many BF16 lower clips
    pool_max_tokens: int = 1 << 22  # pooled tokens above this are subsampled
    max_step_lower: float = 0.05
    max_step_upper: float = 0.1
    min_tokens: int = 32
    lower_min: float = 0.05
    upper_max: float | None = None  # None: 1 + 4 eps_high
    entropy_surge_factor: float = 1.5
    entropy_surge_window: int = 20


@dataclass
class WarmStartConfig:
    """The supervised warm start `model.warm_start: auto` builds (and caches)."""

    steps: int = 800  # at most; stops once greedy train accuracy reaches the target
    batch_size: int = 64
    lr: float = 5e-3
    target_accuracy: float = 0.6
    check_every: int = 50
    seed: int = 0  # its own seed: RL runs of every seed share one warm start


@dataclass
class LogConfig:
    out_dir: str = "runs/default"
    checkpoint_every: int = 20
    keep_last: int = 2
    eval_every: int = 0  # 0: only at the end
    eval_size: int = 128
    tensorboard: bool = False
    # RUN/responses.jsonl at shadow steps: each response's mean entropy, length, advantage
    # and whether FP8 / the BF16 shadow lower-clipped any of its tokens (docs/study.md)
    response_stats: bool = False
    # Weights & Biases beside the JSONL: {project: NAME, mode: online|offline|disabled};
    # mode left out: wandb's own default (WANDB_MODE, else online). None: off.
    wandb: dict | None = None
    progress: bool = True


@dataclass
class RunConfig:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def shadow_passes(self) -> bool:
        return self.loss.mode == "calibrated" or self.calibration.diagnostics


# ---------------------------------------------------------------- what --resume may change

# The one list of config keys a resumed run may change (a key or a whole section). Every other
# key changes the math (loss, precisions, seeds, batch shapes, lr, calibration, task, model) and
# must equal the checkpoint's: new keys are covered without anyone remembering to list them.
RESUME_MAY_CHANGE = (
    "name",
    "log",  # where and how often to log, checkpoint and evaluate
    "train.steps",  # a run may be extended
    "train.fp8_check_finite",  # only decides whether a non-finite input is located
    "model.device",  # e.g. continue a CPU run on a GPU
    "model.init_weights",  # the start weights: a resumed run loads the checkpoint's instead
    "model.warm_start",
    "warm_start",
)


def _leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        # sections are dataclasses; free-form mappings (model.tiny, task.options) are one value
        if isinstance(v, dict) and not prefix:
            out.update(_leaves(v, key))
        else:
            out[key] = v
    return out


def resume_differences(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) of each key outside RESUME_MAY_CHANGE that differs;
    both configs as JSON-like dicts. A key the saved config lacks (an older fp8rl) is skipped."""
    a, b = _leaves(saved), _leaves(current)
    may = RESUME_MAY_CHANGE
    diff = []
    for key in sorted(b):
        if any(key == m or key.startswith(m + ".") for m in may) or key not in a:
            continue
        if a[key] != b[key]:
            diff.append((key, a[key], b[key]))
    return diff


# ---------------------------------------------------------------- building from dicts


def _coerce(key: str, value: Any, default: Any, annotation: str) -> Any:
    """Coerce a YAML/CLI value to the field's type, with an error naming the key."""
    if value is None:
        if "None" in annotation:
            return None
        raise ConfigError(key, value, f"a value of type {annotation}")
    if "dict" in annotation:
        if not isinstance(value, dict):
            raise ConfigError(key, value, "a mapping")
        return dict(value)
    if "tuple" in annotation:
        numbers = isinstance(value, (list, tuple)) and all(
            not isinstance(v, bool) and isinstance(v, (int, float)) for v in value
        )
        if not numbers:
            raise ConfigError(key, value, "a list of numbers, e.g. [0.9, 0.999]")
        return tuple(float(v) for v in value)
    if "bool" in annotation:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "true or false")
    if "int" in annotation and "float" not in annotation:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(key, value, "an integer")
        return value
    if "float" in annotation:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(key, value, "a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number")
        return float(value)
    if "str" in annotation:
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string")
        return value
    return value


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(prefix or "<root>", data, "a mapping")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"{where}{unknown[0]}", data[unknown[0]], f"one of the keys {sorted(known)}"
        )
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            continue
        key = f"{prefix}.{name}" if prefix else name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), data[name] or {}, key)
        else:
            kwargs[name] = _coerce(key, data[name], default, str(f.type))
    return cls(**kwargs)


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


def validate(cfg: RunConfig) -> RunConfig:
    inf = float("inf")
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


ORACLE_LOSSES = ("ppo_clip", "relax_lower", "calibrated")  # PPO-clip with a clip decision


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


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(text, None, "an override of the form key=value (e.g. train.lr=1e-5)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    # YAML 1.1 reads "1e-5" as a string; numbers written that way are meant as floats.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    return key.strip(), value


def set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(key, value, "a key inside a section")
    node[parts[-1]] = value


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple = (), base: dict | None = None
) -> RunConfig:
    """YAML file (optional) < base dict < `key=value` overrides, then validated."""
    data: dict = {}
    if base:
        data = _merge(data, base)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("--config", str(path), "an existing YAML file")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            line = p.read_bytes()[: e.start].count(b"\n") + 1
            raise ConfigError(
                "--config", str(path), f"UTF-8 text (a bad byte on line {line})"
            ) from e
        except yaml.YAMLError as e:
            raise ConfigError("--config", str(path), f"valid YAML ({_one_line(e)})") from e
        if not isinstance(loaded, dict):
            # an empty file would silently run every default; a list or a string is no config
            found = "an empty file" if loaded is None else f"a YAML {type(loaded).__name__}"
            raise ConfigError(
                "--config",
                str(path),
                f"a mapping of sections (model, task, rollout, train, ...), found {found}",
            )
        data = _merge(data, loaded)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(data, key, value)
    return validate(_build(RunConfig, data, ""))


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_from_dict(data: dict) -> RunConfig:
    return validate(_build(RunConfig, data, ""))
