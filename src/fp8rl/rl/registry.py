"""The policy-loss registry: one name -> function table with one typed signature.

losses.py and oracle.py register into it; `policy_loss` (losses.py) looks names up here. Its
own module so that every loss module depends on the registry and none on another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

Metrics = dict[str, torch.Tensor]
Bound = float | torch.Tensor  # a 0-d tensor where the loss picks its bounds on the device (bapo)


class PolicyLossFn(Protocol):
    """A registered loss. It gets validated inputs of one shape (padded positions already
    neutralised, mask bool, advantages broadcast to the token shape, old log-probs detached)
    and returns the per-token loss and its metrics (detached 0-d tensors, docs/rl.md
    "Metrics"). Its keyword-only parameters other than lower/upper are its options."""

    def __call__(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        /,
        *,
        lower: Bound,
        upper: Bound,
        **options: Any,
    ) -> tuple[torch.Tensor, Metrics]: ...


POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register fn(log_prob, old_log_prob, advantages, mask, *, lower, upper,
    **options) -> (per-token loss, metrics) under `name`."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLossFn:
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]
