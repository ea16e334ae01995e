"""The spec of `fp8rl sweep`: a base run config, named arms of overrides, and seeds.

```yaml
base: {...}              # a normal run config (model/task/rollout/train/loss/calibration/log)
arms:                    # name -> overrides merged (deep) onto base
  bf16: {rollout: {precision: bf16}, train: {precision: bf16}}
  fp8:  {calibration: {diagnostics: true}}
seeds: [0, 1, 2]         # each arm runs once per seed, with train.seed = seed
skip_steps: 1            # per-seed means use the steps >= skip_steps
final_window: 10         # reward_final: mean rollout/reward over the last final_window steps
grid: {...}              # optional: axes of named values (study/sweep/grid.py)
```
With a grid, every arm runs once per value of each axis that varies it, as ARM--VALUE--...
(`arms` below holds those expanded arms; `arm_specs` the spec's own). The sweep sets `name`
(the arm), `train.seed` and `log.out_dir` (OUT/ARM/seed-S) of every run.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from ...config import RunConfig, config_from_dict, merge, set_dotted
from ...config.yaml_strict import load_yaml
from ...errors import ConfigError, os_errors
from .grid import SEP, Axis, Cell, cells, expand_arms, grid_to_dict, load_grid

# the sweep's folder: OUT/spec.json, OUT/aggregate.json, OUT/ARM/seed-S/{done.json,worker.log}
DONE_FILE, LOG_FILE = "done.json", "worker.log"
AGGREGATE_FILE, SPEC_FILE = "aggregate.json", "spec.json"
SPEC_KEYS = ("base", "arms", "seeds", "skip_steps", "final_window", "grid")
ARM_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class SweepSpec:
    base: dict
    arms: dict  # name -> overrides, in the spec's order (a grid's: expanded)
    seeds: tuple[int, ...]
    skip_steps: int = 1
    final_window: int = 10
    grid: tuple[Axis, ...] = ()
    arm_specs: dict = field(default_factory=dict)  # a grid's arms as the spec writes them

    def cells(self) -> list[Cell]:
        """The grid's cells, each naming the expanded arm of every spec arm in it (without a
        grid: one cell, named "", of the arms themselves)."""
        return cells(self.arm_specs or self.arms, self.grid)

    def runs(self) -> list[tuple[str, int]]:
        """Every (arm, seed), arm-major in the spec's order."""
        return [(arm, seed) for arm in self.arms for seed in self.seeds]

    def run_data(self, arm: str, seed: int, out_dir: str | Path) -> dict:
        """The merged (not yet validated) run config of one (arm, seed)."""
        data = merge(self.base, self.arms[arm])
        return merge(
            data,
            {
                "name": arm,
                "train": {"seed": seed},
                "log": {"out_dir": str(run_dir(out_dir, arm, seed))},
            },
        )

    def to_dict(self) -> dict:
        """The spec as written (a grid's arms unexpanded): load_spec reads it back."""
        out = {
            "base": self.base,
            "arms": self.arm_specs if self.grid else self.arms,
            "seeds": list(self.seeds),
            "skip_steps": self.skip_steps,
            "final_window": self.final_window,
        }
        return out | ({"grid": grid_to_dict(self.grid)} if self.grid else {})


def run_dir(out_dir: str | Path, arm: str, seed: int) -> Path:
    return Path(out_dir) / arm / f"seed-{seed}"


def _int(key: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(key, value, f"an integer >= {lo}")
    return value


def with_sets(spec: Mapping, sets: Sequence[str]) -> dict:
    """A copy of a spec mapping with each `KEY=VALUE` of `sets` applied: KEY dotted from the
    spec's top (`seeds`, `base.train.steps`, `grid.lr.values`), VALUE read as YAML (fp8rl
    sweep --set: a short check of a spec, or a measurement on part of it)."""
    data = copy.deepcopy(dict(spec))
    for text in sets:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", text, "KEY=VALUE, e.g. base.train.steps=2")
        try:
            value = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as e:  # YamlMeaningError too: a value that reads otherwise
            raise ConfigError(f"--set {key}", raw, f"a YAML value ({e})") from None
        set_dotted(data, key.strip(), value)
    return data


def load_spec(spec, sets: Sequence[str] = ()) -> SweepSpec:
    """A SweepSpec from a YAML/JSON file path, a dict or a SweepSpec, with `sets` applied
    (`with_sets`); checks its shape only (`run_configs` validates the run configs)."""
    if isinstance(spec, SweepSpec):
        if not sets:
            return spec
        spec = spec.to_dict()
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError("sweep spec", str(path), "an existing YAML file")
        try:
            with os_errors("read sweep spec", path):
                spec = load_yaml(path.read_text())
        except yaml.YAMLError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError("sweep spec", str(path), f"valid YAML ({first})") from e
    if not isinstance(spec, Mapping):
        raise ConfigError(
            "sweep spec", type(spec).__name__, f"a mapping with the keys {list(SPEC_KEYS)}"
        )
    if sets:
        spec = with_sets(spec, sets)
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ConfigError(
            str(unknown[0]), spec[unknown[0]], f"one of the sweep keys {list(SPEC_KEYS)}"
        )
    base = spec.get("base") or {}
    if not isinstance(base, Mapping):
        raise ConfigError("base", base, "a mapping (a run config)")
    arms = spec.get("arms")
    if not isinstance(arms, Mapping) or not arms:
        raise ConfigError("arms", arms, "a non-empty mapping of arm name -> config overrides")
    checked = {}
    for name, overrides in arms.items():
        if not isinstance(name, str) or not ARM_NAME.fullmatch(name):
            raise ConfigError(f"arms.{name}", name, "an arm name of letters, digits, '-' and '_'")
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"arms.{name}", overrides, "a mapping of config overrides (or null)")
        checked[name] = dict(overrides or {})
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ConfigError("seeds", seeds, "a non-empty list of integers >= 0")
    seeds = tuple(_int(f"seeds[{i}]", s, 0) for i, s in enumerate(seeds))
    if len(set(seeds)) != len(seeds):
        raise ConfigError("seeds", list(seeds), "distinct integers")
    axes = load_grid(spec.get("grid"), list(checked))
    return SweepSpec(
        base=dict(base),
        arms=expand_arms(checked, axes) if axes else checked,
        seeds=seeds,
        skip_steps=_int("skip_steps", spec.get("skip_steps", 1), 0),
        final_window=_int("final_window", spec.get("final_window", 10), 1),
        grid=axes,
        arm_specs=checked if axes else {},
    )


def _has_key(data: Mapping, dotted: str) -> bool:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _where(spec: SweepSpec, arm: str, key: str) -> str:
    """Which part of the spec sets `key` for the (expanded) arm: the last merged wins, so a
    grid value before its arm, the arm before base."""
    if not spec.grid:
        return f"arms.{arm}" if _has_key(spec.arms[arm], key) else "base"
    own, *values = arm.split(SEP)
    varying = [a for a in spec.grid if a.arms is None or own in a.arms]
    for axis, value in reversed(list(zip(varying, values, strict=True))):
        if _has_key(axis.values[value], key):
            return f"grid.{axis.name}.values.{value}"
    return f"arms.{own}" if _has_key(spec.arm_specs[own], key) else "base"


def run_configs(spec: SweepSpec, out_dir: str | Path) -> dict[tuple[str, int], RunConfig]:
    """Every run's validated RunConfig; a bad value raises ConfigError naming `arms.ARM.KEY`
    when the arm's overrides set that key, else `base.KEY`."""
    configs = {}
    for arm, seed in spec.runs():
        try:
            configs[arm, seed] = cfg = config_from_dict(spec.run_data(arm, seed, out_dir))
        except ConfigError as e:
            where = _where(spec, arm, e.key)
            raise ConfigError(f"{where}.{e.key}", e.value, e.allowed) from None
        weights = cfg.model.init_weights
        if weights and not Path(weights).is_file():
            where = _where(spec, arm, "model.init_weights")
            raise ConfigError(
                f"{where}.model.init_weights", weights, "an existing safetensors file"
            )
        try:
            _check_task(cfg)
        except ConfigError as e:
            where = _where(spec, arm, "task")
            key = "task.name" if e.key == "task" else f"task.options.{e.key.split('.')[-1]}"
            raise ConfigError(f"{where}.{key}", e.value, e.allowed) from None
    return configs


def _check_task(cfg: RunConfig) -> None:
    """The task's name and options, checked by building only its config dataclass: building
    the task itself can start grader processes (math)."""
    from ...tasks.registry import TASKS

    if cfg.task.name not in TASKS:
        raise ConfigError("task", cfg.task.name, "one of " + ", ".join(map(repr, TASKS)))
    config_cls = TASKS[cfg.task.name][1]
    known = {f.name for f in fields(config_cls)}
    for key, value in cfg.task.options.items():
        if key not in known:
            raise ConfigError(
                key, value, f"a field of {config_cls.__name__} ({', '.join(sorted(known))})"
            )
    try:
        config_cls(**cfg.task.options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError("options", cfg.task.options, str(e)) from None
