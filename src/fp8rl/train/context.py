"""What one RL step reads, as one typed value: the Trainer builds it, `run_step` takes it.

Phases get the context and return what they produce (metrics, skip counts); none of them
writes to the Trainer, so a step can be read, tested and benchmarked without one. A mini-batch
update reads only the narrower `UpdateContext` (the model, its optimizer and the step's loss).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import RunConfig
from ..fp8 import Fp8Recipe
from ..rl.calibration_state import CalibrationState
from ..rl.noise import read_noise_calibration
from ..rollout import RolloutEngine
from ..tasks import Task
from .ablations import LogProbHook, log_prob_hook
from .parallel import SingleProcess, share


@dataclass(frozen=True)
class Seeds:
    """Every random draw of a run is a pure function of (seed, step, purpose): resume needs no
    generator state, and one process reproduces N data-parallel ranks (`rollout_shards`)."""

    seed: int
    device: torch.device
    rollout_shards: int = 1
    rank: int = 0
    world_size: int = 1

    def generator(self, step: int, purpose: str) -> torch.Generator:
        seed = zlib.crc32(f"{self.seed}/{step}/{purpose}".encode())
        device = self.device if purpose.startswith("rollout") else "cpu"
        return torch.Generator(device=device).manual_seed(seed)

    def rollout_parts(self, n_groups: int) -> list[tuple[str, int, int]]:
        """(generator purpose, lo, hi) of each `generate` call over this process's groups."""
        shards = self.rollout_shards
        if shards == 1:
            return [("rollout", 0, n_groups)]
        if self.world_size > 1:  # the groups are already this rank's share
            return [(f"rollout/{self.rank}of{shards}", 0, n_groups)]
        return [(f"rollout/{k}of{shards}", *share(n_groups, shards, k)) for k in range(shards)]


@dataclass(frozen=True)
class PromptSchedule:
    """Epoch-wise shuffled prompts, a pure function of (seed, step)."""

    samples: Sequence
    per_step: int
    seed: int

    def for_step(self, step: int) -> list:
        n_total, out = len(self.samples), []
        for pos in range(step * self.per_step, (step + 1) * self.per_step):
            epoch, offset = divmod(pos, n_total)
            perm = np.random.default_rng([self.seed, epoch]).permutation(n_total)
            out.append(self.samples[int(perm[offset])])
        return out


@dataclass(frozen=True)
class StepContext:
    cfg: RunConfig
    model: torch.nn.Module
    engine: RolloutEngine  # or a VllmRolloutEngine (rollout.engine=vllm), same generate
    task: Task
    optimizer: torch.optim.Optimizer
    train_recipe: Fp8Recipe | None  # None: the master dtype
    dp: SingleProcess  # or train.distributed.DataParallel
    calibration: CalibrationState  # the bounds in use; observes shadow steps
    seeds: Seeds
    prompts: PromptSchedule
    log_event: Callable[[str], None]  # one line in RUN/events.log (rank 0)
    device: torch.device
    noise: tuple[float, float] | None = None  # loss.ratio_noise resolved: (sd, corr)
    hook: LogProbHook = field(init=False)  # the ablation's, or production's (changes nothing)

    def __post_init__(self):
        object.__setattr__(self, "hook", log_prob_hook(self.cfg.loss, self.noise))

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature

    def is_shadow_step(self, step: int) -> bool:
        return self.cfg.shadow_passes and self.calibration.is_shadow_step(step)


@dataclass(frozen=True)
class UpdateContext:
    """What one mini-batch update reads: the model and its optimizer, and the step's loss with
    its bounds resolved (train/step.py `update_context` builds it from the StepContext)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_recipe: Fp8Recipe | None
    dp: SingleProcess
    device: torch.device
    temperature: float
    loss: str  # the registered policy loss (rl/losses.py)
    options: dict  # its options from the loss section
    lower: float
    upper: float
    agg: str  # the loss aggregation (token-mean, seq-mean-...)
    micro_batch_size: int  # 0: one micro-batch
    max_grad_norm: float  # inf: no clipping
    check_finite: bool  # train.fp8_check_finite: locate a skipped update's cause
    log_event: Callable[[str], None]


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
