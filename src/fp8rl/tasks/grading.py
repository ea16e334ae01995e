"""Equivalence of an extracted answer and a gold answer with math-verify, from any thread.

math-verify bounds its sympy work with SIGALRM, which Python allows only in the main thread
(elsewhere it raises ValueError). So: in the main thread the check runs inline with
math-verify's own timeouts; from any other thread (or when a batch asks for workers) it runs
in worker processes (`python -m fp8rl.tasks.grading_worker`, talking JSON lines over pipes),
where it runs in their main threads under the same timeouts. A worker that does not answer
within a backstop deadline (a hang that ignores the alarm) is killed and its pending answers
are scored as timeouts.

Plain subprocesses rather than multiprocessing: spawn and forkserver re-import the caller's
__main__ script, which breaks scripts without an `if __name__ == "__main__"` guard, and
fork would copy the parent's threads and torch state.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path

# Starting a worker and importing sympy takes a few seconds on a busy machine; the backstop
# only has to catch hangs, so it is generous.
STARTUP_GRACE_S = 60.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Grade:
    gold_parsed: bool | None  # math-verify read the gold answer as a math object
    parsed: bool  # ... and the extracted answer
    correct: bool
    timeout: bool = False


TIMED_OUT = Grade(gold_parsed=None, parsed=False, correct=False, timeout=True)


def _parse(text: str, timeout_s: int):
    from math_verify import LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException  # a BaseException, not an Exception

    try:
        # Wrapping in \boxed{} makes math-verify read exactly this string as LaTeX, which
        # also covers plain forms such as "3/4", "-7" or "(1, 2)".
        return parse(
            "\\boxed{" + text + "}",
            extraction_config=[LatexExtractionConfig()],
            parsing_timeout=timeout_s,
            raise_on_error=True,
        ), False
    except TimeoutException:
        return [], True
    except Exception:
        return [], False


def _is_math(parsed) -> bool:
    return any(not isinstance(p, str) for p in parsed)


def grade_strings(
    gold: str, answer: str, timeout_s: int = 5, budget_s: float | None = None
) -> Grade:
    """Grade two answer strings in the calling thread, which must be a main thread.

    Each parse and each comparison gets at most `timeout_s`, and all of them together at
    most `budget_s` (default 3 x timeout_s): math-verify compares every pair of the parsed
    forms, so without a total its comparisons alone could take several timeouts.
    """
    from math_verify import verify
    from math_verify.errors import TimeoutException

    deadline = time.monotonic() + (3 * timeout_s if budget_s is None else budget_s)

    def limit() -> int:
        # Whole seconds, as signal.alarm counts them, rounded down so the total holds.
        return min(timeout_s, int(deadline - time.monotonic()))

    def parse(text: str):
        # One reading of the clock: a limit of 0 would switch math-verify's timeout off.
        left = limit()
        return _parse(text, left) if left >= 1 else ([], True)

    gold_p, gold_timeout = parse(gold)
    pred_p, pred_timeout = parse(answer)
    timed_out = gold_timeout or pred_timeout
    correct = False
    # verify(gold_p, pred_p) is any() over these pairs; one pair at a time keeps the total.
    for g, p in product(gold_p, pred_p) if gold_p and pred_p else ():
        left = limit()
        if left < 1:
            timed_out = True
            break
        try:
            if verify([g], [p], timeout_seconds=left, raise_on_error=True):
                correct = True
                break
        except TimeoutException:
            timed_out = True
            break
        except Exception:
            break  # as verify(gold_p, pred_p) with raise_on_error: the first error ends it
    return Grade(_is_math(gold_p), _is_math(pred_p), correct, timed_out)


class _Worker:
    """One grading process; a reader thread drains its stdout so neither pipe can fill up."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fp8rl.tasks.grading_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)  # end of stream: the process exited

    def send(self, items) -> bool:
        try:
            for item in items:
                self.proc.stdin.write(json.dumps(item) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, count: int, deadline_s: float) -> list[Grade] | None:
        """`count` replies, or None when one is late or the process died."""
        out = []
        for _ in range(count):
            try:
                line = self.replies.get(timeout=deadline_s)
            except queue.Empty:
                return None
            if line is None:
                return None
            out.append(Grade(*json.loads(line)))
        return out

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class GraderPool:
    """Up to `workers` grading processes, started on first use and reused."""

    def __init__(self, workers: int = 1):
        self.workers = max(1, int(workers))
        self._idle: queue.Queue = queue.Queue()
        self._started = 0
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._atexit = False

    def _acquire(self, block: bool) -> _Worker | None:
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                if self._started < self.workers:
                    if not self._atexit:
                        atexit.register(self.close)
                        self._atexit = True
                    worker = _Worker()
                    self._started += 1
                    self._all.append(worker)
                    return worker
            if not block:
                return None
            # Poll: a busy worker is either handed back to _idle or retired (freeing a slot).
            try:
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                continue

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._all:  # not already dropped by close()
                self._all.remove(worker)
                self._started -= 1

    def grade(
        self,
        pairs: list[tuple[str, str]],
        timeout_s: int,
        deadline_s: float | None = None,
        budgets: list[float] | None = None,
    ) -> list[Grade]:
        """Grade (gold, answer) pairs, spread over the workers that are free (at least one).

        budgets: each pair's total seconds (see grade_strings); default 3 x timeout_s.
        """
        if not pairs:
            return []
        deadline = STARTUP_GRACE_S + 3 * timeout_s if deadline_s is None else deadline_s
        workers = [self._acquire(block=True)]
        while len(workers) < min(self.workers, len(pairs)):
            extra = self._acquire(block=False)
            if extra is None:
                break
            workers.append(extra)
        chunks = [list(range(len(pairs)))[i :: len(workers)] for i in range(len(workers))]
        sent = [
            w.send([[*pairs[i], timeout_s, budgets[i] if budgets else None] for i in chunk])
            for w, chunk in zip(workers, chunks, strict=True)
        ]
        grades: list[Grade] = [TIMED_OUT] * len(pairs)
        for w, chunk, ok in zip(workers, chunks, sent, strict=True):
            replies = w.receive(len(chunk), deadline) if ok else None
            if replies is None:
                self._retire(w)
                continue
            for i, g in zip(chunk, replies, strict=True):
                grades[i] = g
            self._idle.put(w)
        return grades

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._started = self._all, [], 0
        for w in workers:
            w.kill()
        while not self._idle.empty():
            self._idle.get_nowait()

    def __getstate__(self):
        return {"workers": self.workers}

    def __setstate__(self, state):
        self.__init__(state["workers"])


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def grade_many(
    pairs: list[tuple[str, str]],
    timeout_s: int,
    pool: GraderPool,
    use_pool: bool,
    budgets: list[float] | None = None,
) -> list[Grade]:
    """Grade (gold, answer) pairs inline (main thread only) or in the pool's workers."""
    budgets = budgets if budgets is not None else [3 * timeout_s] * len(pairs)
    if not use_pool and in_main_thread():
        return [grade_strings(g, a, timeout_s, b) for (g, a), b in zip(pairs, budgets, strict=True)]
    return pool.grade(pairs, timeout_s, budgets=budgets)
