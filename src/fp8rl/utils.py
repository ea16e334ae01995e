"""Small helpers usable from any layer."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x over positions where mask is true; 0 where the mask is empty."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def json_safe(value):
    """`value` with every non-finite float (and 0-d tensor) as None: strict JSON has no NaN."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def host_list(x: torch.Tensor) -> list:
    """The values of a tensor that lives on the host by design (a CPU generator's draw, a mask
    computed from host rewards): reading it never waits for a GPU, and this says so."""
    if x.device.type != "cpu":
        raise ValueError(
            f"host_list: a tensor on {x.device}; reading it back would wait for the device"
        )
    return x.tolist()
