"""The seams the step loop calls where data parallelism changes something.

`SingleProcess` is what a plain `Trainer` uses: every reduction is the identity and every
hook does what the single-process loop always did, so one process runs exactly as before.
`fp8rl.train.distributed.DataParallel` overrides them with torch.distributed collectives.
"""

from __future__ import annotations

import torch


def share(n: int, parts: int, k: int) -> tuple[int, int]:
    """[lo, hi) of part k when n items are cut into `parts` contiguous, near-equal parts."""
    return k * n // parts, (k + 1) * n // parts


class SingleProcess:
    world_size = 1
    rank = 0
    is_main = True
    strategy = "single"

    # ------------------------------------------------------------ batch layout
    def share(self, n_groups: int) -> tuple[int, int]:
        """This process's contiguous share [lo, hi) of the step's prompt groups."""
        return 0, n_groups

    def row_offset(self, n_rows: int) -> tuple[int, int]:
        """(offset of this process's first row in the global batch, global row count)."""
        return 0, n_rows

    def pad_responses(self, batch):
        return batch

    # ------------------------------------------------------------ reductions
    def mean_metrics(self, metrics: dict, weights: dict, max_keys=()) -> dict:
        """metrics[k] as a global mean weighted by weights[k] (rows or tokens); max_keys: max."""
        return metrics

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def sum_int(self, value: int) -> int:
        return value

    def sum_dict(self, values: dict) -> dict:
        """Each 0-d tensor summed over ranks, as 0-d tensors on this process's device."""
        return values

    def gather_rows(self, tensors: dict) -> dict:
        """Every process's rows of each (b, ...) tensor, concatenated in rank order."""
        return tensors

    def barrier(self) -> None:
        """Wait for every rank (e.g. until rank 0 has arranged the run folder)."""

    # ------------------------------------------------------------ model hooks
    def unshard(self, model) -> None:
        """Before forward passes whose count may differ between ranks (rollout, log-probs)."""

    def backward(self, model, loss: torch.Tensor, *, last: bool) -> None:
        loss.backward()

    def finish_backward(self, model, had_backward: bool, zero_loss=None) -> None:
        """After a mini-batch's micro-batches: make every rank's gradients the global ones.
        zero_loss(): a zero loss through the model, for a rank without rows to back-propagate."""

    def clip_gradients(self, model, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def optimizer_step(self, model, optimizer) -> None:
        optimizer.step()
