"""One process at a time in a folder: FOLDER/.lock, an exclusive flock held while it works.

The kernel drops an flock when its process exits, however it exits (SIGKILL included), so a
lock file whose lock can be taken is stale: its pid is named in a one-line notice and the
lock is taken over. A folder another live process holds is a one-line error naming that
process, raised before anything in the folder is written. Within one process the lock is
re-entrant (the CLI holds it across fit, evaluation and final.json; fit holds it too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ..errors import Fp8rlError, os_errors
from .runlog import warn

LOCK_FILE = ".lock"


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
