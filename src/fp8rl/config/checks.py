"""The words a config check is written in: a value between bounds, one of a list, and the one
free-form mapping a section checks key by key (log.wandb). Each raises ConfigError naming the
dotted key, the value and what is allowed."""

from __future__ import annotations

from ..errors import ConfigError


def between(key, value, lo, hi, *, lo_open=False, hi_open=False):
    ok_lo = value > lo if lo_open else value >= lo
    ok_hi = value < hi if hi_open else value <= hi
    if not (ok_lo and ok_hi):
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(key, value, f"a value in {lb}{lo}, {hi}{rb}")


def one_of(key, value, allowed):
    if value not in allowed:
        raise ConfigError(key, value, f"one of {list(allowed)}")


WANDB_MODES = ("online", "offline", "disabled")


def check_wandb(w: dict) -> None:
    unknown = sorted(set(w) - {"project", "mode"})
    if unknown:
        raise ConfigError(f"log.wandb.{unknown[0]}", w[unknown[0]], "one of the keys project, mode")
    # no project would land the run in wandb's "uncategorized": a surprise to look for later
    if not isinstance(w.get("project"), str) or not w["project"].strip():
        raise ConfigError("log.wandb.project", w.get("project"), "a W&B project name")
    if "mode" in w:
        one_of("log.wandb.mode", w["mode"], WANDB_MODES)
