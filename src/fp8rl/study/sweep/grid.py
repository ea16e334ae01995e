"""A sweep over a grid of cells: axes of named values, each merged onto the arms it names.

```yaml
grid:                        # axis -> {values: {NAME: overrides}, arms: [ARM, ...]}
  lr:
    values: {lr1e-5: {train: {lr: 1.0e-5}}, lr3e-5: {train: {lr: 3.0e-5}}}
  recipe:
    arms: [fp8]              # the arms this axis varies (left out: every arm)
    values: {tensorwise: {train: {precision: fp8-tensorwise}}, ...}
arms:
  bf16: {...}                # runs once per lr: bf16--lr1e-5, bf16--lr3e-5
  fp8: {...}                 # once per (lr, recipe): fp8--lr1e-5--tensorwise, ...
```

A cell is one value of every axis. In it, each arm runs as ARM--V1--V2 with the values of
the axes that vary it, in the grid's order, its overrides merged onto the arm's (a value is
more specific than its arm). An arm that an axis does not vary is shared by the cells that
differ on that axis only: the bf16 reference of a learning rate serves every FP8 recipe, so
a search pays for it once. Seeds pair across arms as in any sweep.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ...config import merge
from ...errors import ConfigError

SEP = "--"  # ARM--VALUE--VALUE: characters an arm name may hold, none a value name may
VALUE_NAME = re.compile(r"[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*")


@dataclass(frozen=True)
class Axis:
    name: str
    values: dict  # value name -> overrides, in the spec's order
    arms: tuple[str, ...] | None  # None: every arm


@dataclass(frozen=True)
class Cell:
    name: str  # the values joined by SEP, in the grid's order
    values: dict  # axis -> value name
    arms: dict  # spec arm -> the expanded arm that runs it in this cell


def _axis(name, spec, arm_names) -> Axis:
    where = f"grid.{name}"
    if not isinstance(name, str) or not VALUE_NAME.fullmatch(name):
        raise ConfigError(where, name, "an axis name of letters, digits, '_' and single '-'")
    if not isinstance(spec, Mapping) or set(spec) - {"values", "arms"}:
        raise ConfigError(where, spec, "a mapping with the keys 'values' and (optional) 'arms'")
    values = spec.get("values")
    if not isinstance(values, Mapping) or not values:
        raise ConfigError(f"{where}.values", values, "a non-empty mapping of name -> overrides")
    for value, overrides in values.items():
        if not isinstance(value, str) or not VALUE_NAME.fullmatch(value):
            raise ConfigError(
                f"{where}.values.{value}", value, "a name of letters, digits, '_' and single '-'"
            )
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"{where}.values.{value}", overrides, "a mapping of overrides")
    arms = spec.get("arms")
    if arms is not None:
        if not isinstance(arms, (list, tuple)) or not arms or set(arms) - set(arm_names):
            raise ConfigError(
                f"{where}.arms", arms, f"a non-empty list of the spec's arms {list(arm_names)}"
            )
        arms = tuple(arms)
    return Axis(name, {k: dict(v or {}) for k, v in values.items()}, arms)


def load_grid(grid, arm_names) -> tuple[Axis, ...]:
    """The grid's axes, checked (a missing or empty grid: none)."""
    if grid is None:
        return ()
    if not isinstance(grid, Mapping):
        raise ConfigError("grid", grid, "a mapping of axis name -> {values, arms}")
    axes = tuple(_axis(name, spec, arm_names) for name, spec in grid.items())
    for arm in arm_names:
        if SEP in arm and axes:
            raise ConfigError(f"arms.{arm}", arm, f"an arm name without {SEP!r} in a grid sweep")
    return axes


def _varies(axis: Axis, arm: str) -> bool:
    return axis.arms is None or arm in axis.arms


def expanded_name(arm: str, axes: tuple[Axis, ...], values: Mapping[str, str]) -> str:
    return SEP.join([arm] + [values[a.name] for a in axes if _varies(a, arm)])


def expand_arms(arms: Mapping[str, dict], axes: tuple[Axis, ...]) -> dict[str, dict]:
    """Every expanded arm -> its overrides (the arm's, then each varying axis value's), in
    arm order, then the grid's order."""
    out: dict[str, dict] = {}
    for arm, overrides in arms.items():
        mine = [a for a in axes if _varies(a, arm)]
        for combo in itertools.product(*(list(a.values) for a in mine)):
            data = dict(overrides)
            for axis, value in zip(mine, combo, strict=True):
                data = merge(data, axis.values[value])
            out[SEP.join([arm, *combo])] = data
    return out


def cells(arms, axes: tuple[Axis, ...]) -> list[Cell]:
    """Every cell of the grid (one without axes: a single cell named "" holding each arm)."""
    result = []
    for combo in itertools.product(*(list(a.values) for a in axes)):
        values = {a.name: v for a, v in zip(axes, combo, strict=True)}
        result.append(
            Cell(SEP.join(combo), values, {arm: expanded_name(arm, axes, values) for arm in arms})
        )
    return result


def grid_to_dict(axes: tuple[Axis, ...]) -> dict:
    out = {}
    for a in axes:
        out[a.name] = {"values": a.values} | ({"arms": list(a.arms)} if a.arms else {})
    return out
