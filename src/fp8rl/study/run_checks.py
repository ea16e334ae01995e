"""What a tool that concludes checks first: every run of a sweep finished, logged every step
of its config, and the metrics its rule reads finite. Missing, partial or NaN data is an
error naming the run, the step and the metric, never a conclusion."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import Fp8rlError
from ..train.runlog import read_metrics
from .sweep_spec import DONE_FILE, SPEC_FILE, SweepSpec, load_spec, run_dir


class IncompleteRunsError(Fp8rlError):
    """A run a rule needs is missing, unfinished, short or non-finite: no conclusion."""


def sweep_spec(out: Path) -> SweepSpec:
    path = Path(out) / SPEC_FILE
    if not path.is_file():
        raise IncompleteRunsError(f"{path} not found: run `fp8rl sweep` into {out} first")
    return load_spec(path)


def _steps(folder: Path, spec: SweepSpec, arm: str, seed: int, out: Path) -> int:
    """The run's train.steps: its resolved config.json's, else the spec's."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    steps = (cfg.get("train") or {}).get("steps") if isinstance(cfg, dict) else None
    if steps is None:
        steps = (spec.run_data(arm, seed, out).get("train") or {}).get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise IncompleteRunsError(f"{folder}: cannot tell its train.steps ({steps!r})")
    return steps


def complete_runs(out, spec: SweepSpec, needs: tuple[str, ...], from_step: int = 0) -> dict:
    """{arm: {seed: rows of steps 0..train.steps-1}} of every run of the spec, each finished
    (done.json), one row per step, `needs` finite at every step >= from_step."""
    out = Path(out)
    runs: dict = {}
    for arm, seed in spec.runs():
        folder = run_dir(out, arm, seed)
        if not (folder / DONE_FILE).is_file():
            raise IncompleteRunsError(f"{folder}: not finished (no {DONE_FILE}); no conclusion")
        steps = _steps(folder, spec, arm, seed, out)
        rows = {r["step"]: r for r in read_metrics(folder, quiet=True)}
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
        runs.setdefault(arm, {})[seed] = [rows[s] for s in range(steps)]
    return runs
