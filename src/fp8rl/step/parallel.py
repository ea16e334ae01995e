"""The seams the step loop calls where data parallelism changes something, and the ragged
all-gather the Trainer, the TRL trainer and the verl worker share.

`SingleProcess` is what a plain `Trainer` uses: every reduction is the identity and every
hook does what the single-process loop always did, so one process runs exactly as before.
`fp8rl.train.distributed.DataParallel` overrides them with torch.distributed collectives.
`gather_ragged` and `world_size` are plain torch.distributed calls, below the Trainer, so
`fp8rl.integrations` import them without it."""

from __future__ import annotations

import torch
import torch.distributed as dist


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


def world_size(group=None) -> int:
    """The group's size; 1 without torch.distributed initialised (a plain single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def gather_ragged(tensors: dict[str, torch.Tensor], *, dim: int = 0, group=None) -> dict:
    """Every rank's tensors concatenated along `dim` in rank order, the same on every rank.

    The tensors of one rank share their size along `dim`, which may differ between ranks
    (zero included): each is padded to the largest, all-gathered and trimmed. In one process
    `tensors` itself, and likewise when every rank's size is 0."""
    world = world_size(group)
    if world < 2:
        return tensors
    sizes = {x.shape[dim] for x in tensors.values()}
    if len(sizes) != 1:
        raise ValueError(f"gather_ragged: sizes along dim {dim} differ: {sorted(sizes)}")
    # gloo collectives take CPU tensors
    on_cpu = dist.get_backend(group) == "gloo"
    local = {k: (x.cpu() if on_cpu else x) for k, x in tensors.items()}
    counts = _sizes(sizes.pop(), next(iter(local.values())).device, world, group)
    if max(counts) == 0:
        return tensors
    out = {}
    for name, x in local.items():
        padded = _pad(x, dim, max(counts)).contiguous()  # all_gather needs equal shapes
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=group)
        trimmed = [p.narrow(dim, 0, c) for p, c in zip(parts, counts, strict=True)]
        out[name] = torch.cat(trimmed, dim=dim).to(tensors[name].device)
    return out


def _sizes(n: int, device: torch.device, world: int, group) -> list[int]:
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine, group=group)
    return [int(s) for s in sizes]


def _pad(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """x with zeros (False) appended along `dim` up to `size`."""
    extra = size - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)
