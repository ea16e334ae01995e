"""`fp8rl sweep`: every arm of a spec once per seed, in parallel processes, then statistics
over seeds (mean, SE, 95 % t-interval) in OUT/aggregate.json.

    from fp8rl.study.sweep import run_sweep, aggregate, load_runs
    from fp8rl.study.sweep.stats import paired
    from fp8rl.study.sweep.plots import plot_sweep

    agg = run_sweep("sweep.yaml", "runs/sweep", jobs=2)   # resumable; returns aggregate.json
    runs = load_runs("sweep.yaml", "runs/sweep")          # {arm: {seed: metric rows}}
    paired(runs["fp8"], "shadow/lower_clipfrac_neg_fp8", "shadow/lower_clipfrac_neg_bf16")
    plot_sweep("runs/sweep", agg)

Run folders are OUT/ARM/seed-S (a normal run folder plus done.json and worker.log). A run is
complete once its done.json exists. An unfinished attempt of its own resumes from its newest
intact checkpoint (spec: `log.checkpoint_every`), or without one is deleted (worker.log and
ATTEMPT_FILES, nothing else); any other contents move to RUN/.old-<time>/.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path

from ...config.precision import is_quantized
from ...errors import CheckpointError, ConfigError, Fp8rlError
from ...train import run_folder
from ...train.run_folder import OLD_PREFIX, move_aside
from ...train.runlog import METRICS_FILE, RESPONSES_FILE, SAMPLES_FILE, warn
from ...train.warmstart import ensure_warm_start
from ..run_checks import read_json
from .aggregation import aggregate, load_runs
from .memory import available_memory, sweep_default_jobs
from .spec import DONE_FILE, LOG_FILE, SPEC_FILE, load_spec, run_configs, run_dir
from .stats import write_json
from .workers import execute

__all__ = ["run_sweep", "aggregate", "load_runs", "load_spec"]

# everything one attempt of a run writes before its done.json: the worker's log, then what
# Trainer.fit writes (rows, response rows, sampled responses, events, config, the FP8
# conversion, checkpoints with their temporary and corrupt/ folders, TensorBoard and W&B)
ATTEMPT_FILES = (
    LOG_FILE,
    METRICS_FILE,
    RESPONSES_FILE,
    SAMPLES_FILE,
    "events.log",
    "config.json",
    "fp8_conversion.txt",
    "provenance.json",
)
ATTEMPT_DIRS = ("checkpoints", "tensorboard", "wandb")


# ---------------------------------------------------------------- the worker process


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's cpuset, taskset)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


# ---------------------------------------------------------------- the sweep


def _not_own_attempt(folder: Path) -> str | None:
    """What in `folder` the sweep may not delete, in words; None when all of it (earlier
    RUN/.old-* archives aside) is an unfinished attempt of this sweep."""
    # the lock is the sweep's own while it clears (run_sweep holds it)
    entries = [
        e
        for e in sorted(folder.iterdir())
        if not e.name.startswith(OLD_PREFIX) and e.name != run_folder.LOCK_FILE
    ]
    if not entries:
        return None
    if (folder / DONE_FILE).exists():
        return f"a finished run ({DONE_FILE}), rerun under --overwrite"
    if not (folder / LOG_FILE).is_file():
        return f"a run the sweep did not start (no {LOG_FILE})"
    foreign = [
        e.name
        for e in entries
        if not (e.name in ATTEMPT_FILES and e.is_file() or e.name in ATTEMPT_DIRS and e.is_dir())
    ]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        return f"files a sweep attempt does not write ({', '.join(foreign[:3])}{more})"
    return None


def _resumable(folder: Path, cfg) -> bool:
    """Does `folder` hold an unfinished attempt of this sweep with an intact checkpoint, made
    from this config? Then its run resumes from the checkpoint as `fp8rl train --resume` does
    (a config that differs where a resume may not is the same one-line error, before the sweep
    writes anything); without an intact checkpoint it starts over."""
    if not (folder / "checkpoints").is_dir() or _not_own_attempt(folder) is not None:
        return False
    try:
        plan = run_folder.check(cfg, resume=True, overwrite=False)
    except CheckpointError:  # none intact: nothing to resume from
        return False
    return plan.checkpoint is not None


def _clear(folder: Path) -> None:
    """Empty a run folder for a fresh attempt. Only an unfinished attempt of this sweep is
    deleted; anything else moves to RUN/.old-<time>/ as `fp8rl train --overwrite` does, so a
    run the sweep did not make, or a finished one, is never lost."""
    why = _not_own_attempt(folder)
    if why is not None:
        dest = move_aside(folder)
        warn(f"sweep: {folder} held {why}: moved its files to {dest}")
        return
    for entry in folder.iterdir():
        if entry.name in ATTEMPT_DIRS:
            shutil.rmtree(entry)
        elif entry.name in ATTEMPT_FILES:
            entry.unlink()


def _comparable(config: dict) -> dict:
    # name and out_dir are the folder's own identity; JSON turns tuples into lists
    c = json.loads(json.dumps(config))
    c.pop("name", None)
    c.get("log", {}).pop("out_dir", None)
    return c


def _first_difference(a, b, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
    return f"{prefix} {a!r} then, {b!r} now"


def _check_done_matches(folder: Path, cfg) -> None:
    """A complete run made from another config would be mixed in silently: refuse it. Its
    done.json and config.json must read (a damaged one is one line naming it)."""
    note = "; rerun with --overwrite (the run moves aside) or use another output folder"
    read_json(folder / DONE_FILE, note)
    path = folder / "config.json"
    if not path.is_file():
        return
    then, now = _comparable(read_json(path, note)), _comparable(cfg.to_dict())
    if then != now:
        raise Fp8rlError(
            f"{folder} was run with another config ({_first_difference(then, now)}): "
            "rerun with --overwrite or use another output folder"
        )


def _cost(cfg) -> float:
    """A rough relative cost of a run, to start the longest first: FP8 emulated on the CPU
    costs about 3x a high-precision forward, and shadow passes add forwards."""
    fp8 = sum(is_quantized(p) for p in (cfg.rollout.precision, cfg.train.precision))
    every = cfg.calibration.shadow_every or cfg.calibration.interval
    shadow = 0.5 / every if cfg.shadow_passes else 0.0
    return cfg.train.steps * cfg.rollout.prompts_per_step * cfg.rollout.n * (1 + fp8) * (1 + shadow)


def _holding_out(fn):
    """fn(spec, out_dir, ...) under OUT's lock (train/run_folder.py): a second sweep on the
    same OUT is refused naming this one's pid before it writes anything."""

    @functools.wraps(fn)
    def locked(spec, out_dir, **kw):
        with run_folder.held(out_dir, "fp8rl sweep"):
            return fn(spec, out_dir, **kw)

    return locked


@_holding_out
def run_sweep(
    spec,
    out_dir,
    *,
    jobs: int | None = None,
    threads: int = 1,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Run every (arm, seed) of `spec` (a path, dict or SweepSpec) that is not complete, in
    `jobs` spawned worker processes (default: the usable cores, fewer where that many runs
    would not fit in memory: memory.py) of `threads` torch threads each, then
    `aggregate`.

    Every run config is validated before any folder is made. A run folder holding done.json
    is kept (unless `overwrite`). One without it resumes from its newest intact checkpoint
    when it is an unfinished attempt of this sweep (`_resumable`); otherwise it starts over:
    an attempt of this sweep is deleted first, anything else in the folder moves to
    RUN/.old-<time>/ with a warning. When runs
    fail the others still finish, then Fp8rlError names the failed (arm, seed) and its worker.log.
    Returns the aggregate (also written to OUT/aggregate.json).

    Workers are spawned, so a script calling this needs the `if __name__ == "__main__":`
    guard. With one torch thread per worker (the default) metrics do not depend on `jobs`;
    more threads may change the last bits of a run's floating-point sums."""
    spec = load_spec(spec)
    out = Path(out_dir)
    configs = run_configs(spec, out)
    if jobs is None:  # the runs that fit in memory, at most one a core
        cores = usable_cores()
        jobs, why = sweep_default_jobs(configs.values(), cores, available_memory())
        if jobs < cores:  # memory, not the cores, set it: say why a core stays idle
            print(f"fp8rl sweep: {jobs} job(s) at a time: {why}", file=sys.stderr)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError("--jobs", jobs, "an integer >= 1")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError("--threads", threads, "an integer >= 1")
    pending, resume = [], set()
    for (arm, seed), cfg in configs.items():
        folder = run_dir(out, arm, seed)
        if (folder / DONE_FILE).is_file() and not overwrite:
            _check_done_matches(folder, cfg)
            continue
        pending.append((arm, seed))
        if not overwrite and _resumable(folder, cfg):
            resume.add((arm, seed))
    # a folder a live `fp8rl train` holds is refused before anything is written or moved
    folders = [run_dir(out, arm, seed) for arm, seed in pending]
    locks = [run_folder.acquire(f, "fp8rl sweep") for f in folders if f.is_dir()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / SPEC_FILE, spec.to_dict())
        for run, folder in zip(pending, folders, strict=True):
            folder.mkdir(parents=True, exist_ok=True)
            if run not in resume:
                _clear(folder)
    finally:
        for lock in locks:
            lock.release()
    # a warm start several runs share is built once, here, not by racing workers
    for run in pending:
        cfg = configs[run]
        if cfg.model.warm_start == "auto" and not cfg.model.init_weights:
            ensure_warm_start(cfg, progress=progress)
    pending.sort(key=lambda run: -_cost(configs[run]))  # longest first: a shorter tail
    failed = _execute(pending, configs, (jobs, threads), len(configs), progress, resume)
    if failed:
        (arm, seed), error = failed[0]
        more = f" (and {len(failed) - 1} more failed run(s))" if len(failed) > 1 else ""
        raise Fp8rlError(
            f"run {arm} seed {seed} failed: {error}; see {run_dir(out, arm, seed) / LOG_FILE}{more}"
        )
    return aggregate(spec, out)


def _execute(pending, configs, workers, total: int, progress: bool, resume=frozenset()) -> list:
    """[((arm, seed), error)] of the pending runs that failed (study/sweep/workers.py)."""
    return execute(pending, configs, workers, total, progress, resume)
