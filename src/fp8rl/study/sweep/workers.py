"""The sweep's worker processes: one spawned process per run, at most `jobs` at a time.

A worker dies with the sweep (Linux: the parent-death signal, PR_SET_PDEATHSIG; elsewhere a
thread that watches the parent's pid), so a killed sweep leaves no run training on. A worker
that dies (out of memory, killed) fails the one run it held, named by that run; the others go
on. Each run's step shows on the sweep's bar (stderr) while it trains."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from ...train.runlog import METRICS_FILE, CounterBar
from .spec import DONE_FILE, LOG_FILE
from .stats import write_json

PR_SET_PDEATHSIG = 1  # linux/prctl.h
REFRESH_S = 2.0  # how often the bar reads the running runs' steps
TAIL_BYTES = 1 << 16  # enough for the last metrics row


def die_with_parent(parent: int) -> None:
    """Make this process exit when the process `parent` dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # it died before the signal was armed
                    os._exit(1)
                return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _init_worker(threads: int = 1) -> None:
    # one intra-op thread per run by default: results then do not depend on how many run side
    # by side, and jobs = cores never oversubscribes (docs/benchmarks.md measures it)
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # torch allows setting it once per process
        torch.set_num_interop_threads(1)


def _run_one(arm: str, seed: int, data: dict, resume: bool = False) -> dict:
    """One run in a worker process; stdout, stderr and any traceback go to worker.log (a
    resumed attempt appends to it). Returns {"ok": True, ...done.json} or {"ok": False,
    "error": one line} (never raises, so nothing unpicklable crosses the process boundary)."""
    folder = Path(data["log"]["out_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # a file descriptor for the worker's stdout and stderr: bytes, whatever encoding they use
    with open(folder / LOG_FILE, "ab" if resume else "wb") as log:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            done = _train(arm, seed, data, resume)
            write_json(folder / DONE_FILE, done)
            return {"ok": True, **done}
        except Exception as e:
            traceback.print_exc()
            return {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def _train(arm: str, seed: int, data: dict, resume: bool = False) -> dict:
    from ...config import config_from_dict
    from ...train.runlog import read_metrics
    from ...train.trainer import Trainer
    from ...utils import seed_everything

    cfg = config_from_dict(data)
    t0 = time.perf_counter()
    seed_everything(cfg.train.seed)
    trainer = Trainer(cfg, progress=False)
    new = trainer.fit(resume=resume)
    final = trainer.evaluate() if cfg.log.eval_size > 0 else {}
    rows = read_metrics(cfg.log.out_dir, quiet=True)  # a resumed run: the earlier steps too
    # the steps an earlier attempt made count at their own time, not at this attempt's
    earlier = sum(r.get("time/wall_step") or 0.0 for r in rows[: len(rows) - len(new)])
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(rows),
        "wall_s": time.perf_counter() - t0 + earlier,
        "eval_final": final,
        "resumed_at": rows[len(rows) - len(new)]["step"] if resume and new else None,
    }


def _worker(conn, parent: int, threads: int, run: tuple, data: dict, resume: bool) -> None:
    die_with_parent(parent)
    _init_worker(threads)
    conn.send(_run_one(*run, data, resume))
    conn.close()


def _died(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"its worker process died ({signal.Signals(-code).name})"
    return f"its worker process exited with code {code} before it reported"


def _last_step(folder: Path) -> int | None:
    """The step of the run's last complete metrics row (its file's tail), or None."""
    try:
        with open(folder / METRICS_FILE, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            step = json.loads(line).get("step")
            if isinstance(step, int):
                return step
    return None


def _steps_info(running: dict, configs: dict, shown: int = 3) -> str:
    """'a/seed-0 12/100  b/seed-1 3/100 +2 more': the running runs' steps."""
    parts = []
    for run in sorted(r for r, *_ in running.values())[:shown]:
        cfg = configs[run]
        step = _last_step(Path(cfg.log.out_dir))
        parts.append(f"{run[0]}/seed-{run[1]} {0 if step is None else step + 1}/{cfg.train.steps}")
    more = len(running) - shown
    return "  ".join(parts) + (f" +{more} more" if more > 0 else "")


class Workers:
    """At most `jobs` worker processes, each running one run; `reap` waits for the next to end."""

    def __init__(self, jobs: int, threads: int, configs: dict, resume):
        self.jobs, self.threads, self.configs, self.resume = jobs, threads, configs, resume
        self.ctx = get_context("spawn")
        self.running: dict = {}  # sentinel -> (run, process, connection)
        self.results: dict = {}

    def start(self, run: tuple) -> None:
        recv, send = self.ctx.Pipe(duplex=False)
        args = (send, os.getpid(), self.threads, run, self.configs[run].to_dict())
        p = self.ctx.Process(target=_worker, args=(*args, run in self.resume), name=str(run))
        p.start()
        send.close()  # the child holds the only writing end: its death reads as EOF
        self.running[p.sentinel] = (run, p, recv)

    def reap(self, timeout: float) -> list[tuple]:
        """[(run, result)] of the runs that ended within `timeout` seconds."""
        conns = {c: s for s, (_, _, c) in self.running.items()}
        ended = []
        for ready in wait([*self.running, *conns], timeout):
            sentinel = conns.get(ready, ready)
            if sentinel not in self.running:
                continue
            run, p, conn = self.running[sentinel]
            if ready is conn:
                with contextlib.suppress(EOFError, OSError):
                    self.results[run] = conn.recv()
                continue
            if run not in self.results and conn.poll():
                with contextlib.suppress(EOFError, OSError):
                    self.results[run] = conn.recv()
            p.join()
            conn.close()
            del self.running[sentinel]
            ended.append((run, self.results.pop(run, None) or {"ok": False, "error": _died(p)}))
        return ended

    def stop(self) -> None:
        """Kill every worker still running and wait for it: no run outlives the sweep."""
        for _, p, _ in self.running.values():
            p.kill()
        for _, p, conn in self.running.values():
            p.join()
            conn.close()
        self.running.clear()


def execute(pending, configs, workers, total: int, progress: bool, resume=frozenset()) -> list:
    """Run the pending (arm, seed) in spawned processes, `workers` = (jobs, torch threads each),
    longest first as given; returns [((arm, seed), error)] of failures in `pending`'s order."""
    jobs, threads = workers
    failed: list = []
    if not pending:
        return failed
    # "sweep ━━━━ 3/12 runs 0:01:02 fp8/seed-0 12/100": the runs in flight, from the start
    bar = CounterBar(
        total,
        "sweep",
        completed=total - len(pending),
        enabled=progress,
        unit="runs",
        bar_width=30,
        elapsed=True,
        info=True,
    )
    pool, queue = Workers(jobs, threads, configs, resume), list(pending)
    try:
        while queue or pool.running:
            while queue and len(pool.running) < jobs:
                pool.start(queue.pop(0))
            said = f"{len(failed)} failed  " if failed else ""
            bar.update(info=said + _steps_info(pool.running, configs))
            for run, result in pool.reap(REFRESH_S if progress else None):
                if not result["ok"]:
                    failed.append((run, result["error"]))
                bar.update(advance=1)
    finally:
        pool.stop()
        bar.close()
    order = {run: i for i, run in enumerate(pending)}
    return sorted(failed, key=lambda f: order[f[0]])
