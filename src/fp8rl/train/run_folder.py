"""A run folder is never silently reused: the checks `Trainer.fit` makes before it writes.

- A folder that holds metrics or checkpoints needs `resume` (continue it) or `overwrite` (its
  contents move to RUN/.old-<timestamp>/; nothing is deleted).
- `resume` continues from the newest checkpoint that passes verification (newer corrupt ones
  move to checkpoints/corrupt/); with no checkpoint it is an error, unless the folder holds
  nothing (then the run starts fresh).
- The resumed config must equal the checkpoint's on every key but those in
  `config.RESUME_MAY_CHANGE` (train.steps, log.*, ...).

`check` only reads; `apply` then moves files. Both run before anything else is written, and
under the folder's lock: `Trainer.fit` holds RUN/.lock while it runs.

One process at a time in a folder (`acquire`, `held`): FOLDER/.lock, an exclusive flock held
while it works. The kernel drops an flock when its process exits, however it exits (SIGKILL
included), so a lock file whose lock can be taken is stale: its pid is named in a one-line
notice and the lock is taken over. A folder another live process holds is a one-line error
naming that process, raised before anything in the folder is written. Within one process the
lock is re-entrant (the CLI holds it across fit, evaluation and final.json; fit holds it too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RunConfig, resume_differences
from ..errors import CheckpointError, Fp8rlError, os_error_reason, os_errors
from .checkpoint import (
    check_trainer_state,
    checkpoint_step,
    find_intact_checkpoint,
    quarantine,
)
from .runlog import METRICS_FILE, warn

OLD_PREFIX = ".old-"
LOCK_FILE = ".lock"


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
            with held(run_dir, "fp8rl train --resume"):
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


# ---------------------------------------------------------------- the folder's lock


class FolderLock:
    """This process's hold on one lock file: the open, flocked fd and the holds counted."""

    def __init__(self, path: Path, fd: int, created: Path | None):
        self.path, self.fd, self.created = path, fd, created
        self.count = 1

    def release(self) -> None:
        """Drop one hold; the last removes the lock file (still locked, so no other process
        can have taken it) and any folder this lock created that is still empty."""
        self.count -= 1
        if self.count > 0:
            return
        _held.pop(str(self.path), None)
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        folder = self.path.parent
        # a refused or failed start leaves no folder behind: those it made, while empty
        while self.created is not None and (
            folder == self.created or self.created in folder.parents
        ):
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent


_held: dict[str, FolderLock] = {}  # lock file path -> this process's lock on it


def acquire(
    folder: str | Path, what: str, *, name: str = LOCK_FILE, wait: bool = False
) -> FolderLock:
    """Lock `folder` (made if missing) for `what` (e.g. "fp8rl train"); Fp8rlError naming
    the holder when another live process has it, or with `wait` until that one is done."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise Fp8rlError(f"{folder} is a file, not a folder: {what} needs a folder there")
    created = _first_missing(Path(os.path.abspath(folder)))
    with os_errors("create folder", folder, note=f"{what} needs it"):
        folder.mkdir(parents=True, exist_ok=True)
    if created is not None:  # compared with real paths on release
        created = Path(os.path.realpath(created))
    path = Path(os.path.realpath(folder)) / name  # one key per folder, however it is spelled
    mine = _held.get(str(path))
    if mine is not None:
        mine.count += 1
        return mine
    while True:
        with os_errors("open lock file", path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise Fp8rlError(
                f"{folder} is in use by {holder} (lock file {path}): {what} may not run "
                "there at the same time; wait for it to end or choose another folder"
            ) from None
        except OSError as e:  # a file system without flock (some network mounts)
            os.close(fd)
            raise Fp8rlError(f"cannot lock {path} for {what}: {e.strerror or e}") from e
        # the holder may have removed the file between our open and flock: lock the new one
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    old = _read(fd)
    if old:
        warn(f"took over the stale lock {path} of {_describe(old)}, which is no longer running")
    mark = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(mark).encode(), 0)
    lock = _held[str(path)] = FolderLock(path, fd, created)
    return lock


@contextlib.contextmanager
def held(folder: str | Path, what: str, *, name: str = LOCK_FILE, wait: bool = False):
    """`acquire` for the body of a with statement; released on any exit from it."""
    lock = acquire(folder, what, name=name, wait=wait)
    try:
        yield lock
    finally:
        lock.release()


def _first_missing(folder: Path) -> Path | None:
    missing = None
    while not folder.exists():
        missing, folder = folder, folder.parent
    return missing


def _read(fd: int) -> dict | None:
    raw = os.pread(fd, 4096, 0)
    if not raw.strip():
        return None
    try:
        mark = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return mark if isinstance(mark, dict) else {}


def _holder(fd: int) -> str:
    # the holder writes its pid right after it locks: give it a moment
    for _ in range(20):
        mark = _read(fd)
        if mark:
            return _describe(mark)
        time.sleep(0.05)
    return "another process (pid not yet written)"


def _describe(mark: dict) -> str:
    pid, host, what = mark.get("pid", "?"), mark.get("host", "?"), mark.get("what")
    since = mark.get("since")
    started = ""
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        started = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
    return f"pid {pid} on {host}" + (f" ({what}{started})" if what else "")
