"""Argument checks shared by the rl modules. They read shapes and Python numbers only,
never tensor values, so they cost no device sync."""

from __future__ import annotations

import math

import torch


def check_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor in `others` must have the shape of `ref` (None entries are skipped)."""
    check_tensor(ref_name, ref)
    if ref.dim() not in (1, 2):
        raise ValueError(f"{ref_name} must be (B, T) or flat (n,), got shape {tuple(ref.shape)}")
    for name, x in others.items():
        if x is None:
            continue
        check_tensor(name, x)
        if x.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected {tuple(ref.shape)} like {ref_name}"
            )


def require_2d(name: str, x: torch.Tensor, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{what} needs (B, T) rows; {name} has shape {tuple(x.shape)}")


def broadcast_advantages(
    advantages: torch.Tensor, like: torch.Tensor, like_name: str
) -> torch.Tensor:
    """(B,) per-sequence advantages become (B, T); (B, T) or flat (n,) pass through."""
    check_tensor("advantages", advantages)
    if advantages.shape == like.shape:
        return advantages.to(like.dtype)
    if like.dim() == 2 and advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.to(like.dtype).unsqueeze(-1).expand_as(like)
    raise ValueError(
        f"advantages has shape {tuple(advantages.shape)}; expected {tuple(like.shape)} "
        f"(like {like_name}) or ({like.shape[0]},) per sequence"
    )


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def sanitised(mask, **tensors) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Bool mask and each tensor detached with padded positions set to 0."""
    m = as_bool_mask(mask)
    out = {}
    for name, x in tensors.items():
        x = x.detach()
        out[name] = torch.where(m, x, torch.zeros_like(x))
    return m, out


def check_float(name: str, value, *, low=None, high=None, low_open=False, high_open=False) -> float:
    """A finite-or-inf Python number within [low, high] (open ends where asked)."""
    if (
        isinstance(value, torch.Tensor)
        or not isinstance(value, (int, float))
        or isinstance(value, bool)
    ):
        raise ValueError(f"{name} must be a Python number, got {value!r}")
    v = float(value)
    bad = math.isnan(v)
    if low is not None:
        bad |= v <= low if low_open else v < low
    if high is not None:
        bad |= v >= high if high_open else v > high
    if bad:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{name} = {value!r} is outside {lo}{low}, {high}{hi}")
    return v


def check_bounds(name: str, bounds) -> tuple[float, float]:
    """A (lower, upper) pair with 0 < lower < 1 < upper, both finite."""
    try:
        lower, upper = bounds
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (lower, upper) pair, got {bounds!r}") from None
    lower = check_float(
        f"{name}[0] (lower)", lower, low=0.0, high=1.0, low_open=True, high_open=True
    )
    upper = check_float(
        f"{name}[1] (upper)", upper, low=1.0, high=math.inf, low_open=True, high_open=True
    )
    return lower, upper
