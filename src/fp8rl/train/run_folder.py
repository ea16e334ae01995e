"""A run folder is never silently reused: the checks `Trainer.fit` makes before it writes.

- A folder that holds metrics or checkpoints needs `resume` (continue it) or `overwrite` (its
  contents move to RUN/.old-<timestamp>/; nothing is deleted).
- `resume` continues from the newest checkpoint that passes verification (newer corrupt ones
  move to checkpoints/corrupt/); with no checkpoint it is an error, unless the folder holds
  nothing (then the run starts fresh).
- The resumed config must equal the checkpoint's on every key but those in
  `config.RESUME_MAY_CHANGE` (train.steps, log.*, ...).

`check` only reads; `apply` then moves files. Both run before anything else is written, and
under the folder's lock (run_lock.py): `Trainer.fit` holds RUN/.lock while it runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RunConfig, resume_differences
from ..errors import CheckpointError, Fp8rlError, os_error_reason, os_errors
from . import run_lock
from .checkpoint import checkpoint_step, find_intact_checkpoint, quarantine
from .run_lock import LOCK_FILE
from .runlog import METRICS_FILE, warn
from .state_schema import check_trainer_state

OLD_PREFIX = ".old-"


@dataclass
class Plan:
    run_dir: Path
    checkpoint: Path | None = None  # resume from this (verified) checkpoint ...
    state: dict | None = None  # ... whose state.json this is
    corrupt: list = field(default_factory=list)  # (newer checkpoint, reason): moved aside
    move_aside: bool = False  # overwrite: the old contents go to RUN/.old-<timestamp>/


def holds_a_run(run_dir: Path) -> list[str]:
    """What in the folder belongs to an earlier run: metrics rows or checkpoints."""
    found = []
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_FILE)
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(ckpts.iterdir()):
        found.append("checkpoints/")
    return found


def check(cfg: RunConfig, *, resume: bool, overwrite: bool) -> Plan:
    """What fit will do with the run folder; raises (one line) where it may not. Reads only."""
    run_dir = Path(cfg.log.out_dir)
    if resume and overwrite:
        raise Fp8rlError(
            "--resume and --overwrite exclude each other: continue the run in "
            f"{run_dir} or start it over, not both"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise Fp8rlError(f"run folder {run_dir} is a file, not a folder (log.out_dir)")
    found = holds_a_run(run_dir) if run_dir.is_dir() else []
    plan = Plan(run_dir)
    if not found:
        return plan  # a new or empty folder: a fresh start, also under --resume
    if overwrite:
        plan.move_aside = True
        return plan
    if not resume:
        raise Fp8rlError(
            f"run folder {run_dir} already holds {' and '.join(found)} of an earlier "
            "run: pass --resume to continue it or --overwrite to start over (the old "
            f"files move to {run_dir}/{OLD_PREFIX}<time>/), or choose another --out"
        )
    ckpt, state, corrupt = find_intact_checkpoint(run_dir, check_trainer_state)
    if ckpt is None:
        if corrupt:
            raise CheckpointError(
                f"--resume: no intact checkpoint in {run_dir}/checkpoints; newest: {corrupt[0][1]}"
            )
        raise CheckpointError(
            f"--resume: {run_dir} holds {METRICS_FILE} but no checkpoint to "
            "continue from; pass --overwrite to start over"
        )
    at = checkpoint_step(ckpt)
    if cfg.train.steps < at:  # else config.json would say N while the run holds `at` steps
        raise Fp8rlError(
            f"--resume: train.steps = {cfg.train.steps} is below the step of {ckpt.name} "
            f"({at}) the run continues from: give train.steps >= {at}"
        )
    saved = state.get("config")
    if isinstance(saved, dict):
        diff = resume_differences(saved, json.loads(json.dumps(cfg.to_dict())))
        if diff:
            shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in diff[:6])
            more = f" and {len(diff) - 6} more" if len(diff) > 6 else ""
            raise Fp8rlError(
                f"--resume: the config differs from the one {ckpt.name} was written "
                f"with on keys that change the math: {shown}{more}; only train.steps, "
                "log.* and the keys in fp8rl.config.RESUME_MAY_CHANGE may change"
            )
    plan.checkpoint, plan.state, plan.corrupt = ckpt, state, corrupt
    return plan


@os_errors("move aside")
def move_aside(run_dir: Path) -> Path:
    """Every entry of `run_dir` but earlier RUN/.old-* folders moved into a new
    RUN/.old-<timestamp>/ (renames: nothing is copied or deleted); returns that folder."""
    dest = run_dir / f"{OLD_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest = run_dir / f"{OLD_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{n}"
        n += 1
    dest.mkdir()
    for entry in sorted(run_dir.iterdir()):
        # the lock stays: moved, it would no longer keep another process out of RUN
        if not entry.name.startswith(OLD_PREFIX) and entry.name != LOCK_FILE:
            os.replace(entry, dest / entry.name)
    return dest


@os_errors("prepare run folder")
def apply(plan: Plan) -> None:
    """Carry out a checked plan: move old contents or corrupt checkpoints aside, mkdir."""
    run_dir = plan.run_dir
    if plan.move_aside:
        dest = move_aside(run_dir)
        warn(f"--overwrite: moved the earlier run's files in {run_dir} to {dest}")
    for path, reason in plan.corrupt:
        quarantine(path, reason)
    run_dir.mkdir(parents=True, exist_ok=True)


def resume_config(cfg: RunConfig, reload, steps_given: bool) -> RunConfig:
    """The config `fp8rl train --resume` continues with, or one line why it cannot: the
    folder must hold a run (else `--resume` would quietly start a fresh one), and without
    `train.steps=N` on the command line the run ends at its own train.steps (its config.json;
    `fp8rl train --config C train.steps=100`, killed, then `--resume` must not run to the
    file's 200), so a config.json that cannot say is an error. `reload(override)`: the
    config again with that override."""
    run_dir = Path(cfg.log.out_dir)
    if not (run_dir.is_dir() and holds_a_run(run_dir)):
        if (run_dir / LOCK_FILE).exists():  # a live run before its first row: named by pid
            with run_lock.held(run_dir, "fp8rl train --resume"):
                pass
        raise Fp8rlError(
            f"--resume: {run_dir} holds no run to continue (no {METRICS_FILE}, no "
            "checkpoint): leave out --resume to start one, or check --out / log.out_dir"
        )
    if steps_given:
        return cfg
    path = run_dir / "config.json"
    try:
        steps = json.loads(path.read_text(encoding="utf-8"))["train"]["steps"]
        if not isinstance(steps, int) or isinstance(steps, bool):
            raise TypeError(f"train.steps is {steps!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = os_error_reason(e) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        raise Fp8rlError(
            f"--resume: cannot read the run's train.steps from {path} ({why}): give "
            "train.steps=N to say where the run ends"
        ) from e
    if steps != cfg.train.steps:
        # said, not silent: an edit of train.steps in the config file extends nothing
        warn(
            f"--resume: the run in {run_dir} continues to its own train.steps = "
            f"{steps}, not the config's {cfg.train.steps} (train.steps=N extends it)"
        )
        cfg = reload(f"train.steps={steps}")
    return cfg
