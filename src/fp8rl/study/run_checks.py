"""What a tool that concludes checks first: every run of a sweep finished, logged every step
of its config (as many rows as its done.json counts), and the metrics its rule reads finite;
enough seeds and steps for the rule. Missing, partial or NaN data is an error naming the run,
the step and the metric, never a conclusion; a damaged file is one line naming it."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path

from ..config.sections import RunConfig
from ..errors import DataError, Fp8rlError, os_errors
from ..train.runlog import read_metrics
from .sweep.spec import DONE_FILE, SPEC_FILE, SweepSpec, load_spec, run_dir


class IncompleteRunsError(Fp8rlError):
    """A run a rule needs is missing, unfinished, short or non-finite: no conclusion."""


def read_json(path: Path, note: str = "") -> dict:
    """The JSON object in `path`; unreadable, not JSON or not an object: one line naming it."""
    path = Path(path)
    with os_errors("read", path):
        text = path.read_bytes()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise DataError(f"{path} is damaged: not valid JSON ({first}){note}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is damaged: a JSON {type(data).__name__}, not an object{note}")
    return data


def sweep_spec(out: Path) -> SweepSpec:
    path = Path(out) / SPEC_FILE
    if not path.is_file():
        raise IncompleteRunsError(f"{path} not found: run `fp8rl sweep` into {out} first")
    return load_spec(path)


def run_steps(folder: Path, fallback=None) -> int:
    """The run's train.steps: its resolved config.json's, else `fallback` (the spec's)."""
    path = Path(folder) / "config.json"
    cfg = read_json(path) if path.is_file() else {}
    steps = (cfg.get("train") or {}).get("steps", fallback)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise IncompleteRunsError(f"{folder}: cannot tell its train.steps ({steps!r})")
    return steps


def finished_run(folder: Path, steps: int, needs=(), from_step: int = 0) -> list[dict]:
    """The rows of steps 0..steps-1 of a finished run (done.json), one per step, as many as
    done.json counts, `needs` finite at every step >= from_step; else IncompleteRunsError."""
    done_path = Path(folder) / DONE_FILE
    if not done_path.is_file():
        raise IncompleteRunsError(
            f"{folder}: not finished (no {DONE_FILE}), the sweep is not complete: "
            "run it again to finish; no conclusion"
        )
    done = read_json(done_path)
    rows = {r["step"]: r for r in read_metrics(folder, quiet=True)}
    if not rows:
        raise IncompleteRunsError(f"{folder}: no metrics row for step 0 of {steps} (no rows)")
    for step in range(steps):
        row = rows.get(step)
        if row is None:
            raise IncompleteRunsError(f"{folder}: no metrics row for step {step} of {steps}")
        for key in needs if step >= from_step else ():
            value = row.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise IncompleteRunsError(
                    f"{folder}: step {step} has no finite {key} ({value!r}); no conclusion"
                )
    counted = done.get("steps")
    if isinstance(counted, int) and len(rows) < counted:
        raise IncompleteRunsError(
            f"{folder}: {DONE_FILE} counts {counted} steps, its metrics hold {len(rows)} rows"
        )
    return [rows[s] for s in range(steps)]


def complete_runs(out, spec: SweepSpec, needs: tuple[str, ...], from_step: int = 0) -> dict:
    """{arm: {seed: rows of steps 0..train.steps-1}} of every run of the spec, each checked by
    `finished_run`, each made with the spec's config (`same_spec`), all of the same length:
    the contract of every tool that pairs, windows or averages runs."""
    out = Path(out)
    runs: dict = {}
    lengths: dict[int, Path] = {}
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        spec_steps = (spec.run_data(arm, seed, out).get("train") or {}).get("steps")
        steps = run_steps(folder, spec_steps) if (folder / DONE_FILE).is_file() else 1
        runs.setdefault(arm, {})[seed] = finished_run(folder, steps, needs, from_step)
        same_spec(folder, spec.run_data(arm, seed, out))
        lengths.setdefault(steps, folder)
    if len(lengths) > 1:
        (a, first), (b, other) = sorted(lengths.items())[:2]
        raise IncompleteRunsError(
            f"{other}: a run of {b} steps beside {first} of {a}: the runs of one study are "
            "paired and windowed step by step, so they must be of one length; no conclusion"
        )
    return runs


# keys a run of the spec may hold other values of: where it logged, and its machine's paths
_FREE = ("log", "name", "model.device", "model.warm_start", "model.init_weights", "train.steps")


def same_spec(folder: Path, data: dict) -> None:
    """IncompleteRunsError when the run's config.json differs from the spec's run config
    `data` on a key the spec sets (a run of another config dropped into the sweep folder)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return  # a run from before config.json was written: finished_run checked the rest
    saved = read_json(path)
    for key, want in _leaves(data):
        if any(key == f or key.startswith(f + ".") for f in _FREE):
            continue
        node = saved
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING and _as_loaded(node) != _as_loaded(want):
            raise IncompleteRunsError(
                f"{folder}: made with {key} = {node!r}, its sweep's spec says {want!r}: a run of "
                "another config; move it out or rerun it with `fp8rl sweep`; no conclusion"
            )


_MISSING = object()


def _as_loaded(value):
    """A value as the config loader reads it: YAML 1.1 leaves `2e-05` a string and the loader
    coerces it to the float the run's config.json holds, so a numeric string is that number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_as_loaded(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_loaded(v) for k, v in value.items()}
    return value


def _leaves(data: dict, prefix: str = ""):
    for k, v in data.items():
        key = f"{prefix}{k}"
        # sections (model.keep_high_precision too) hold fields, which a spec may set a few of;
        # a free-form mapping (model.tiny, task.options) is one value
        if isinstance(v, dict) and dataclasses.is_dataclass(_section_type(key)):
            yield from _leaves(v, key + ".")
        else:
            yield key, v


def _section_type(key: str):
    """The type of the config field at dotted `key` (RunConfig's fields down), None if none."""
    t = RunConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(t):
            return None
        t = typing.get_type_hints(t).get(part)
    return t


def enough(out, spec: SweepSpec, runs: dict, rule: str, seeds: int, steps: int, why: str):
    """IncompleteRunsError unless the sweep has `seeds` seeds and every run `steps` steps: the
    least `rule` can conclude from (`why` says where the steps come from)."""
    if len(spec.seeds) < seeds:
        raise IncompleteRunsError(
            f"{out}: {len(spec.seeds)} seed(s); {rule} needs at least {seeds}; no conclusion"
        )
    for arm, by_seed in runs.items():
        for seed, rows in by_seed.items():
            if len(rows) < steps:
                raise IncompleteRunsError(
                    f"{run_dir(out, arm, seed)}: a run of {len(rows)} steps; {rule} needs at "
                    f"least {why} = {steps}; no conclusion"
                )
