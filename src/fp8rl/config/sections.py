"""The sections of a run's config, each dataclass with the `check()` of its own fields (the
allowed values imported from the layer that owns them). Every bad value raises `ConfigError`
naming the dotted key, the value and what is allowed; rules across sections are validate.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..rl.calibration import RULES
from ..rl.clipping import AGGREGATIONS
from ..rl.loss_modes import LOSS_MODES
from ..rl.losses import ADVANTAGE_KINDS
from ..rl.tis import TIS_LEVELS, TIS_MODES
from ..rollout.fp8_kv_cache import KV_CACHE_DTYPES
from .checks import between, check_wandb, one_of
from .keep_precision import KeepHighPrecisionConfig
from .precision import PRECISIONS

INF = float("inf")
ROLLOUT_ENGINES = ("fp8rl", "vllm")
SEED_MAX = (1 << 63) - 1  # numpy's and torch's generators take seeds in [0, 2**63)


@dataclass
class ModelConfig:
    source: str = "tiny"  # "tiny" (a random model from a config) or a local HF checkpoint folder
    tiny: dict = field(default_factory=dict)  # fp8rl.models.tiny_model: model_type and overrides
    init_weights: str | None = None  # a safetensors file to start from; wins over warm_start
    # none | auto (the cached supervised warm start of this task and model, built if missing:
    # train/warmstart.py, settings in the warm_start section) | a safetensors file
    warm_start: str = "none"
    dtype: str = "float32"  # master weights: float32 or bfloat16
    device: str = "auto"  # auto | cpu | cuda
    # the linear layers a quantized run keeps in high precision (config/keep_precision.py)
    keep_high_precision: KeepHighPrecisionConfig = field(default_factory=KeepHighPrecisionConfig)

    def check(self) -> None:
        one_of("model.dtype", self.dtype, ("float32", "bfloat16"))
        one_of("model.device", self.device, ("auto", "cpu", "cuda"))
        self.keep_high_precision.check()


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    options: dict = field(default_factory=dict)  # passed to fp8rl.tasks.get_task
    # prompts through the tokenizer's chat template: true | false | null (on for tasks made
    # for chat models, arithmetic_qa, when the tokenizer has a template; docs/tasks.md)
    chat: bool | None = None
    # with chat: default (the template's own) | none (no system turn) | any other text
    system_prompt: str = "default"

    def check(self) -> None:
        if not self.system_prompt.strip():
            raise ConfigError(
                "task.system_prompt", self.system_prompt, "'default', 'none' or a non-empty text"
            )
        if self.chat is False and self.system_prompt != "default":
            raise ConfigError(
                "task.system_prompt", self.system_prompt, "'default' with task.chat=false"
            )


@dataclass
class RolloutConfig:
    precision: str = "fp8-rowwise"
    prompts_per_step: int = 32
    n: int = 8  # samples per prompt (the GRPO group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    # fp8rl (the trainer's own engine, sharing its weights) | vllm (a colocated vllm.LLM,
    # weights pushed every `sync_every` steps; `vllm`: its engine options; docs/rollout.md)
    engine: str = "fp8rl"
    vllm: dict = field(default_factory=dict)
    sync_every: int = 1
    # model (keys and values in the model's dtype) | fp8 (e4m3 with per-head scales
    # recalibrated after every weight update; fp8rl's engine only: docs/rollout.md)
    kv_cache: str = "model"

    def check(self) -> None:
        one_of("rollout.precision", self.precision, PRECISIONS)
        one_of("rollout.engine", self.engine, ROLLOUT_ENGINES)
        one_of("rollout.kv_cache", self.kv_cache, KV_CACHE_DTYPES)
        if self.engine == "vllm" and self.kv_cache != "model":
            raise ConfigError(
                "rollout.kv_cache",
                self.kv_cache,
                "'model' with rollout.engine=vllm (an FP8 KV cache is not supported there yet)",
            )
        between("rollout.sync_every", self.sync_every, 1, 1 << 30)
        if self.engine == "fp8rl":  # it shares the trainer's weights: nothing to set or sync
            if self.vllm:
                raise ConfigError("rollout.vllm", self.vllm, "{} with rollout.engine=fp8rl")
            if self.sync_every != 1:
                raise ConfigError(
                    "rollout.sync_every", self.sync_every, "1 with rollout.engine=fp8rl"
                )
        between("rollout.prompts_per_step", self.prompts_per_step, 1, 1 << 20)
        between("rollout.n", self.n, 1, 1024)
        between("rollout.temperature", self.temperature, 0.0, 10.0, lo_open=True)
        between("rollout.top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if self.engine == "vllm" and self.top_p < 1.0:  # docs/rollout.md, "Top-p and the trainer"
            raise ConfigError(
                "rollout.top_p",
                self.top_p,
                "1.0 with rollout.engine=vllm (it returns the nucleus' log-probs only, and TIS "
                "and the mismatch metrics need the full softmax's)",
            )
        between("rollout.max_new_tokens", self.max_new_tokens, 1, 1 << 20)


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
    # mini_batches 1 only: the old log-probs are the update forward's own (step/fold.py)
    fold_old_log_probs: bool = False

    def check(self) -> None:
        one_of("train.precision", self.precision, PRECISIONS)
        between("train.steps", self.steps, 0, 1 << 30)
        between("train.seed", self.seed, 0, SEED_MAX)  # before any run folder is made
        between("train.lr", self.lr, 0.0, 1.0, lo_open=True)
        between("train.weight_decay", self.weight_decay, 0.0, 1.0)
        between("train.grad_clip", self.grad_clip, 0.0, INF)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError("train.betas", list(self.betas), "two numbers in [0, 1)")
        between("train.mini_batches", self.mini_batches, 1, 1 << 30)
        between("train.micro_batch_size", self.micro_batch_size, 0, 1 << 20)
        between("train.logprob_micro_batch_size", self.logprob_micro_batch_size, 0, 1 << 20)
        if self.fold_old_log_probs and self.mini_batches != 1:  # else the old policy is stale
            raise ConfigError(
                "train.fold_old_log_probs",
                True,
                f"false while train.mini_batches is {self.mini_batches} (folding needs 1)",
            )


@dataclass
class LossConfig:
    mode: str = "grpo"  # a key of rl.loss_modes.LOSS_MODES
    eps_low: float | None = None  # None: the mode's default (3e-4 for the gspo modes, else 0.2)
    eps_high: float | None = None  # None: the mode's default (0.28 dapo, 4e-4 gspo, else 0.2)
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
        low = self.table.eps_low if self.eps_low is None else self.eps_low
        high = self.table.eps_high if self.eps_high is None else self.eps_high
        return low, high

    def resolved_agg(self) -> str:
        return self.table.agg if self.agg is None else self.agg

    def resolved_dynamic_sampling(self) -> bool:
        return (
            self.table.dynamic_sampling if self.dynamic_sampling is None else self.dynamic_sampling
        )

    def check(self) -> None:
        """The fields alone; overlong_buffer (it needs rollout.max_new_tokens) and the
        ablations' needs are validate's."""
        one_of("loss.mode", self.mode, tuple(LOSS_MODES))
        low, high = self.resolved_eps()
        between("loss.eps_low", low, 0.0, 1.0, lo_open=True, hi_open=True)
        between("loss.eps_high", high, 0.0, 10.0, lo_open=True)
        one_of("loss.agg", self.resolved_agg(), AGGREGATIONS)
        one_of("loss.advantage", self.advantage, ADVANTAGE_KINDS)
        if self.dual_clip is not None:
            between("loss.dual_clip", self.dual_clip, 1.0, INF, lo_open=True)
        between("loss.relaxed_lower", self.relaxed_lower, 0.0, 1.0, lo_open=True, hi_open=True)
        between("loss.overlong_factor", self.overlong_factor, 0.0, INF)
        one_of("loss.tis_level", self.tis_level, TIS_LEVELS)
        one_of("loss.tis_mode", self.tis_mode, TIS_MODES)
        between("loss.tis_cap", self.tis_cap, 1.0, INF)
        between("loss.bapo_target", self.bapo_target, 0.0, 1.0, lo_open=True, hi_open=True)
        one_of("loss.clip_source", self.clip_source, ("fp8", "bf16"))


@dataclass
class CalibrationConfig:
    diagnostics: bool = False  # shadow passes without touching the bounds (study vanilla FP8)
    rule: str = "pooled"  # a name in rl.calibration.RULES (docs/rl.md, "The rule table")
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

    def check(self) -> None:
        """The fields alone; upper_max's floor (1 + loss.eps_high) is validate's."""
        one_of("calibration.rule", self.rule, tuple(RULES))
        between("calibration.interval", self.interval, 1, 1 << 20)
        if self.shadow_every is not None:
            between("calibration.shadow_every", self.shadow_every, 1, 1 << 20)
            if self.interval % self.shadow_every:
                need = f"a multiple of calibration.shadow_every ({self.shadow_every})"
                raise ConfigError("calibration.interval", self.interval, need)
        between("calibration.pool_window", self.pool_window, 1, 1 << 20)
        between("calibration.pool_min_clips", self.pool_min_clips, 1, 1 << 30)
        between("calibration.pool_max_tokens", self.pool_max_tokens, 1, 1 << 40)
        between("calibration.lower_min", self.lower_min, 0.0, 1.0, lo_open=True, hi_open=True)
        between("calibration.max_step_lower", self.max_step_lower, 0.0, 1.0, lo_open=True)
        between("calibration.max_step_upper", self.max_step_upper, 0.0, 10.0, lo_open=True)
        between("calibration.min_tokens", self.min_tokens, 1, 1 << 30)
        surge = self.entropy_surge_factor
        between("calibration.entropy_surge_factor", surge, 1.0, INF, lo_open=True)
        between("calibration.entropy_surge_window", self.entropy_surge_window, 2, 1 << 20)


@dataclass
class WarmStartConfig:
    """The supervised warm start `model.warm_start: auto` builds (and caches)."""

    steps: int = 800  # at most; stops once greedy train accuracy reaches the target
    batch_size: int = 64
    lr: float = 5e-3
    target_accuracy: float = 0.6
    # also stop once the mean token entropy of samples at temperature 1 on the train split
    # falls to this (nats/token): a start with sampling entropy left (docs/training.md)
    target_entropy: float | None = None
    check_every: int = 50
    seed: int = 0  # its own seed: RL runs of every seed share one warm start

    def check(self) -> None:
        between("warm_start.steps", self.steps, 1, 1 << 30)
        between("warm_start.batch_size", self.batch_size, 1, 1 << 20)
        between("warm_start.lr", self.lr, 0.0, 1.0, lo_open=True)
        between("warm_start.target_accuracy", self.target_accuracy, 0.0, 1.0)
        if self.target_entropy is not None:
            between("warm_start.target_entropy", self.target_entropy, 0.0, INF, lo_open=True)
        between("warm_start.check_every", self.check_every, 1, 1 << 30)
        between("warm_start.seed", self.seed, 0, SEED_MAX)


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
    # RUN/samples.jsonl: this many sampled responses a step (prompt, response, reward); 0: off
    samples: int = 0
    # Weights & Biases beside the JSONL: {project: NAME, mode: online|offline|disabled};
    # mode left out: wandb's own default (WANDB_MODE, else online). None: off.
    wandb: dict | None = None
    progress: bool = True

    def check(self) -> None:
        between("log.checkpoint_every", self.checkpoint_every, 0, 1 << 30)
        between("log.keep_last", self.keep_last, 1, 1000)
        between("log.eval_every", self.eval_every, 0, 1 << 30)
        between("log.eval_size", self.eval_size, 0, 1 << 20)
        between("log.samples", self.samples, 0, 1 << 20)
        if self.wandb is not None:
            check_wandb(self.wandb)


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
        return self.loss.table.moves_bounds or self.calibration.diagnostics
