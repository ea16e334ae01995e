"""What one RL step reads: the run's `StepPlan` and the `StepContext` around it.

The plan holds every decision a run makes once (sampling, the loss and its options,
aggregation, TIS, batching, the ablation's hook), resolved from the config by `build_plan`, the
one place in step/ that reads the config. The context adds what lives: the model, engine,
optimizer, the calibration state (the one owner of "is this a shadow step?" and "what are this
step's clip bounds?") and the data-parallel seam. Phases take the context and return what they
produce; none writes to the Trainer, so a step can be read, tested and benchmarked without one.
A mini-batch update reads only the narrower `UpdateContext` (the model, its optimizer, the plan
it holds, not copies, and the step's clip bounds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import RunConfig
from ..fp8 import Fp8Recipe
from ..rl.calibration_state import CalibrationState
from ..rl.loss_modes import LossMode
from ..rollout import RolloutEngine, SamplingParams
from ..tasks import Task
from .ablations import LogProbHook, log_prob_hook
from .parallel import SingleProcess
from .records import PromptSchedule, Seeds


@dataclass(frozen=True)
class StepPlan:
    """Every per-run decision of a step, resolved once (`build_plan`)."""

    sampling: SamplingParams  # rollout.n responses per prompt, temperature, top_p, length
    mode: LossMode  # the loss mode's row of rl.loss_modes.LOSS_MODES
    loss_options: dict  # the registered loss's options from the loss section
    agg: str  # the loss aggregation (token-mean, seq-mean-...)
    std_normalize: bool  # GRPO advantages (Dr. GRPO: False)
    dynamic_sampling: bool  # drop the groups whose rewards are all equal
    overlong_buffer: int  # DAPO overlong shaping; 0: off
    overlong_factor: float
    tis: bool  # truncated importance sampling between rollout and trainer
    tis_level: str
    tis_mode: str
    tis_cap: float
    mini_batches: int  # optimizer updates per step
    micro_batch_size: int  # 0: one micro-batch per update
    logprob_micro_batch_size: int | None  # old log-probs and shadow passes; None: all rows
    max_grad_norm: float  # inf: no clipping
    check_finite: bool  # train.fp8_check_finite: locate a skipped update's cause
    response_stats: bool  # log.response_stats: per-response rows at shadow steps
    samples: int  # log.samples: sampled responses logged a step
    hook: LogProbHook  # the ablation's, or production's (changes nothing)
    fold_old_log_probs: bool = False  # train.fold_old_log_probs (step/fold.py)

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    def folds(self, batch, shadow: bool) -> bool:
        """Does this step fold its old-log-prob pass into the update (step/fold.py)? Only
        where nothing but the loss (and TIS) reads the old log-probs before the update: no
        shadow passes this step, the production hook, and an engine that gave the entropy."""
        return (
            self.fold_old_log_probs
            and self.mini_batches == 1
            and not shadow
            and type(self.hook) is LogProbHook
            and batch.entropy is not None
        )


def build_plan(cfg: RunConfig, noise: tuple[float, float] | None = None) -> StepPlan:
    """The run's plan from a validated config; `noise`: loss.ratio_noise resolved (sd, corr)."""
    rc, tc, lc = cfg.rollout, cfg.train, cfg.loss
    return StepPlan(
        sampling=SamplingParams(
            n=rc.n, temperature=rc.temperature, top_p=rc.top_p, max_new_tokens=rc.max_new_tokens
        ),
        mode=lc.table,
        loss_options=lc.table.loss_options(lc),
        agg=lc.resolved_agg(),
        std_normalize=lc.advantage == "grpo",
        dynamic_sampling=lc.resolved_dynamic_sampling(),
        overlong_buffer=lc.overlong_buffer,
        overlong_factor=lc.overlong_factor,
        tis=lc.tis,
        tis_level=lc.tis_level,
        tis_mode=lc.tis_mode,
        tis_cap=lc.tis_cap,
        mini_batches=tc.mini_batches,
        micro_batch_size=tc.micro_batch_size,
        logprob_micro_batch_size=tc.logprob_micro_batch_size or None,
        max_grad_norm=tc.grad_clip if tc.grad_clip > 0 else float("inf"),
        check_finite=tc.fp8_check_finite,
        response_stats=cfg.log.response_stats,
        samples=cfg.log.samples,
        hook=log_prob_hook(lc.clip_source, noise),
        fold_old_log_probs=tc.fold_old_log_probs,
    )


@dataclass(frozen=True)
class StepContext:
    plan: StepPlan
    model: torch.nn.Module
    engine: RolloutEngine  # or a VllmRolloutEngine (rollout.engine=vllm), same generate
    task: Task
    optimizer: torch.optim.Optimizer
    train_recipe: Fp8Recipe | None  # None: the master dtype
    dp: SingleProcess  # or train.distributed.DataParallel
    calibration: CalibrationState  # the shadow cadence and the bounds; observes shadow steps
    seeds: Seeds
    prompts: PromptSchedule
    log_event: Callable[[str], None]  # one line in RUN/events.log (rank 0)
    device: torch.device


@dataclass(frozen=True)
class UpdateContext:
    """What one mini-batch update reads: the model and its optimizer, the run's plan (the
    loss, its options and aggregation, micro-batching, gradient clipping) and this step's clip
    bounds (`from_plan`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_recipe: Fp8Recipe | None
    dp: SingleProcess
    device: torch.device
    plan: StepPlan
    lower: float
    upper: float
    log_event: Callable[[str], None]

    @classmethod
    def from_plan(
        cls,
        plan: StepPlan,
        bounds: tuple[float, float],
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_recipe: Fp8Recipe | None,
        dp: SingleProcess,
        device: torch.device,
        log_event: Callable[[str], None],
    ) -> UpdateContext:
        """The updates' context of a plan at the clip `bounds` of this step."""
        return cls(
            model=model,
            optimizer=optimizer,
            train_recipe=train_recipe,
            dp=dp,
            device=device,
            plan=plan,
            lower=bounds[0],
            upper=bounds[1],
            log_event=log_event,
        )
