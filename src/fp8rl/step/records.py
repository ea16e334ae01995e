"""The records one RL step passes between its phases (step.py, update.py): where its random
draws and prompts come from, the step's batch after filtering, a mini-batch, the gradients an
update leaves, its output, the builder of a shadow step's record (`ShadowRows`, rl/shadow.py),
the step's result and the timer of its phases. Kept apart from step.py so that the modules it
calls (context, update, ablations, fold) can name them without importing it."""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..rl.shadow import ShadowRows
from ..rollout import RolloutBatch
from .parallel import share


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


@dataclass
class StepData:
    """The batch of one step after filtering, with everything the updates need."""

    batch: RolloutBatch
    advantages: torch.Tensor  # (B,)
    old_log_probs: torch.Tensor | None  # (B, T) as the loss sees them; folded: after the update
    old_log_probs_shadow: torch.Tensor | None  # their BF16 shadow (shadow steps only)
    tis: torch.Tensor | None  # (B, T) detached TIS weights
    metrics: dict = field(default_factory=dict)  # of the old log-prob pass (TIS)
    hook_state: object = None  # what ctx.hook kept of the old pass for the updates
    fold: object = None  # fold.Fold: the updates make the old log-probs (folded steps)


@dataclass(frozen=True)
class MiniBatch:
    """One update's rows, and the loss normalizers of the whole (global) mini-batch."""

    rows: list[int]  # this process's rows of the step's batch (host ints)
    total_rows: int  # its rows on all processes (the seq-mean normalizer)
    total_tokens: torch.Tensor  # 0-d, at least 1: its response tokens on all processes

    @classmethod
    def whole(cls, mask: torch.Tensor) -> MiniBatch:
        """All rows of a one-process batch as one mini-batch (`mask`: its response mask)."""
        return cls(list(range(mask.shape[0])), mask.shape[0], mask.float().sum().clamp_min(1))


@dataclass
class Gradients:
    """What forward_backward leaves for apply_update: this rank's sums, still on the device."""

    loss: torch.Tensor  # 0-d: this rank's share of the mini-batch loss
    metrics: dict  # the loss's metrics, pooled by tokens (0-d tensors)
    log_prob: torch.Tensor  # (b, T) the log-probs the loss saw, detached
    clean_log_prob: torch.Tensor  # (b, T) the model's, before ctx.hook changed them
    nonfinite: list[str]  # the FP8 inputs found non-finite (train.fp8_check_finite)


@dataclass
class UpdateOutput:
    log_prob: torch.Tensor  # (b, T) the log-probs the loss saw (FP8, or noised), detached
    metrics: dict  # python floats
    skipped: bool
    clean_log_prob: torch.Tensor | None = None  # the model's, before ctx.hook changed them


def shadow_rows(data: StepData, index, log_prob, log_prob_shadow) -> ShadowRows:
    """A shadow step's record (rl/shadow.py) of the rows `index` of the step's batch, with
    the updates' log-probs of those rows and their BF16 shadows."""
    return ShadowRows(
        log_prob=log_prob,
        old_log_prob=data.old_log_probs[index],
        log_prob_shadow=log_prob_shadow,
        old_log_prob_shadow=data.old_log_probs_shadow[index],
        advantages=data.advantages[index],
        mask=data.batch.response_mask[index],
        entropy=data.batch.entropy[index],
    )


@dataclass
class StepResult:
    metrics: dict
    skipped_updates: int = 0  # mini-batch updates skipped for a non-finite loss or gradient
    responses: list[dict] | None = None  # log.response_stats, at shadow steps
    shadow: ShadowRows | None = None  # at shadow steps: the rows the shadow phase read
    samples: list[dict] | None = None  # log.samples: a few of the step's responses


def sample_rows(step: int, texts, prompts, rewards, count: int) -> list[dict]:
    """`count` of the step's responses, spread evenly over the batch (one per group while
    count <= the number of prompts), each with its question, answer and reward."""
    total = len(texts)
    picked = sorted({i * total // count for i in range(count)}) if total and count else []
    return [
        {
            "step": step,
            "index": i,
            "question": prompts[i].question or prompts[i].prompt,
            "answer": prompts[i].answer,
            "response": texts[i],
            "reward": float(rewards[i]),
        }
        for i in picked
    ]


class Timer:
    """Seconds per phase (CUDA synchronised at both ends), as time/* metrics.

    Wall seconds (`time/<phase>`) and the process's CPU seconds over all its threads
    (`time/cpu_<phase>`): on a shared machine wall time measures the neighbours too.
    """

    def __init__(self):
        self.times: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()
                self.c0 = time.process_time()

            def __exit__(self, *exc):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timer.times[name] = timer.times.get(name, 0.0) + time.perf_counter() - self.t0
                timer.cpu[name] = timer.cpu.get(name, 0.0) + time.process_time() - self.c0

        return _Ctx()

    def metrics(self) -> dict:
        out = {f"time/{k}": v for k, v in self.times.items()}
        out["time/step"] = sum(self.times.values())
        out.update({f"time/cpu_{k}": v for k, v in self.cpu.items()})
        out["time/cpu_step"] = sum(self.cpu.values())
        return out
