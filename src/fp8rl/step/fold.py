"""`train.fold_old_log_probs`: a step without the old-log-prob pass, where the math allows.

With one optimizer update a step (`train.mini_batches: 1`) the old policy is the current one:
the old log-probs equal the update forward's own log-probs, detached (TRL's GRPOTrainer does
the same with num_iterations 1). A folded step takes them from there, so every ratio is
exactly 1 and nothing clips; the TIS weights, per token or per row, come from each
micro-batch's own rows. After the update the step's old log-probs are filled in, in the
batch's row order, so the mismatch metrics read what the skipped pass would have given.

A step folds only where nothing but the loss (and TIS) reads the old log-probs before the
update (`StepPlan.folds`): no shadow passes this step, the production hook (an ablation changes
them), and an engine that gave the entropy (else the old-log-prob pass is where it comes from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rl.tis import tis_weights
from .records import StepData


@dataclass(frozen=True)
class Fold:
    """How a folded step makes each micro-batch's old log-probs and TIS weights."""

    tis: dict | None  # tis_weights' options (level, mode, cap); None: no TIS

    def micro(self, log_prob: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(old log-probs, TIS weights or None) of a micro-batch from its own log-probs."""
        old = log_prob.detach()
        if self.tis is None:
            return old, None
        w, _ = tis_weights(old, batch.comparable_log_probs, batch.response_mask, **self.tis)
        return old, w

    def fill(self, data: StepData, index: torch.Tensor, clean: torch.Tensor) -> None:
        """The step's old log-probs (and TIS metrics) from the update's clean log-probs of the
        rows `index`: a permutation of the batch's rows, undone here."""
        old = clean.new_empty(clean.shape)
        old[index] = clean
        data.old_log_probs = old
        if self.tis is not None:
            b = data.batch
            data.tis, data.metrics = tis_weights(
                old, b.comparable_log_probs, b.response_mask, **self.tis
            )


def folded_data(plan, batch, advantages) -> StepData:
    """A folded step's StepData: its old log-probs come from the update (`Fold.fill`)."""
    tis = None
    if plan.tis:
        tis = {"level": plan.tis_level, "mode": plan.tis_mode, "cap": plan.tis_cap}
    return StepData(batch, advantages, None, None, None, fold=Fold(tis))
