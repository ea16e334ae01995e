"""The records one RL step passes between its phases (train/step.py): the step's batch after
filtering, a mini-batch, the gradients an update leaves, its output and the step's result. Kept
apart from step.py so that the modules step.py calls (shadow, ablations) can name them without
importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..rollout import RolloutBatch


@dataclass
class StepResult:
    metrics: dict
    skipped_updates: int = 0  # mini-batch updates skipped for a non-finite loss or gradient
    responses: list[dict] | None = None  # log.response_stats, at shadow steps


@dataclass
class StepData:
    """The batch of one step after filtering, with everything the updates need."""

    batch: RolloutBatch
    advantages: torch.Tensor  # (B,)
    old_log_probs: torch.Tensor  # (B, T) as the loss sees them
    old_log_probs_ref: torch.Tensor | None  # their BF16 shadow (shadow steps only)
    tis: torch.Tensor | None  # (B, T) detached TIS weights
    metrics: dict = field(default_factory=dict)  # of the old log-prob pass (TIS)
    hook_state: object = None  # what ctx.hook kept of the old pass for the updates


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
