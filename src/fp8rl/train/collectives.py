"""The ragged all-gather the Trainer, the TRL trainer and the verl worker share: every rank
holds a different number of rows (or tokens), and the shadow phase needs all of them.

A plain module of torch.distributed calls, so `fp8rl.integrations` can import it without the
Trainer."""

from __future__ import annotations

import torch
import torch.distributed as dist


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
