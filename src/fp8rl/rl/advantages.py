"""Advantages and reward shaping: GRPO, Dr. GRPO, DAPO dynamic sampling and overlong penalty
(docs/rl.md, "Advantages").

Rewards are one per sample, the `group_size` samples of a prompt consecutive.
"""

from __future__ import annotations

import torch

from ._shapes import check_float, check_tensor

# grpo: (r - mean) / std within a group; drgrpo: r - mean (Dr. GRPO drops the std)
ADVANTAGE_KINDS = ("grpo", "drgrpo")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    check_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards has {rewards.shape[0]} entries, not a multiple of group_size={group_size}"
        )
    return rewards.view(-1, group_size)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """(r - group mean) / (group std + eps), one advantage per sample, shape (B,).

    std is the unbiased (n - 1) group std, as torch.std; a group of one sample has advantage 0.
    std_normalize=False is Dr. GRPO: r - group mean, no division.
    """
    eps = check_float("eps", eps, low=0.0)
    g = _groups(rewards, group_size)
    if not g.is_floating_point():
        g = g.to(torch.get_default_dtype())
    centred = g - g.mean(dim=1, keepdim=True)
    if std_normalize:
        std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling: False for every sample of a group whose rewards are all equal
    (such a group has zero advantage everywhere and only dilutes the batch)."""
    g = _groups(rewards, group_size)
    varied = g.amax(dim=1) != g.amin(dim=1)
    return varied.repeat_interleave(group_size)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment: min(-(len - (max_len - buffer)) / buffer * factor, 0).

    Zero up to max_len - buffer, then a linear ramp reaching -factor at max_len
    (not clamped beyond max_len, as the paper's formula).
    """
    check_tensor("lengths", lengths)
    max_len = check_float("max_len", max_len, low=0.0, low_open=True)
    buffer = check_float("buffer", buffer, low=0.0, high=max_len, low_open=True)
    factor = check_float("factor", factor, low=0.0)
    lengths = lengths.to(torch.get_default_dtype()) if not lengths.is_floating_point() else lengths
    penalty = -(lengths - (max_len - buffer)) / buffer * factor
    return penalty.clamp(max=0.0)
