"""Errors shared by every layer. Each names the field and the value that was wrong; an OS
error names the operation and the path (`os_errors`, the one place that maps them)."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager


class Fp8rlError(Exception):
    """Base class of the errors fp8rl raises on purpose (the CLI prints them as one line)."""


class ConfigError(Fp8rlError, ValueError):
    """A configuration key has a bad value."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}' = {value!r} is invalid: expected {allowed}")


class CheckpointError(Fp8rlError):
    """A checkpoint or model folder is missing, incomplete or malformed."""


class DataError(Fp8rlError, ValueError):
    """A data file or one of its rows is malformed."""


class StorageError(Fp8rlError):
    """The operating system refused a file operation (permission, full disk, a file where a
    folder should be, ...). The message names the operation, the path and the OS's reason."""


# a library that wraps an OS error in its own type (safetensors: "... (os error 27)")
_WRAPPED_ERRNO = re.compile(r"\(os error (\d+)\)")


def os_error_reason(e: BaseException) -> str:
    """'File too large (errno 27)': the OS's words and number, from an OSError or from a
    library error that wraps one; else the error's first line."""
    code = getattr(e, "errno", None)
    found = None if code is not None else _WRAPPED_ERRNO.search(str(e))
    code = int(found.group(1)) if found else code
    words = getattr(e, "strerror", None) or (os.strerror(code) if code else None)
    if words is None:
        words = (str(e).splitlines() or [type(e).__name__])[0]
    return f"{words} (errno {code})" if code else words


def storage_error(
    e: BaseException,
    operation: str | None = None,
    path=None,
    *,
    note: str = "",
    cls: type[Fp8rlError] = StorageError,
) -> Fp8rlError:
    """The one-line error of a failed file operation: 'cannot OPERATION PATH: REASON; NOTE'.
    `path` (what the user knows, e.g. the final checkpoint name) wins over the OS's filename
    (which may be a temporary one)."""
    if path is None and getattr(e, "filename", None) is not None:
        path = os.fsdecode(e.filename)
        if getattr(e, "filename2", None) is not None:
            path += f" -> {os.fsdecode(e.filename2)}"
    if isinstance(e, OSError) and e.errno is None and e.strerror is None:
        reason = str(e)  # raised with a message of its own, e.g. FileNotFoundError("...")
    else:
        reason = os_error_reason(e)
    where = " ".join(str(x) for x in (operation and f"cannot {operation}", path) if x)
    text = f"{where}: {reason}" if where else reason
    return cls(f"{text}; {note}" if note else text)


@contextmanager
def os_errors(
    operation: str,
    path=None,
    *,
    note: str = "",
    cls: type[Fp8rlError] = StorageError,
    also: tuple[type[BaseException], ...] = (),
):
    """Any OSError (and the library errors in `also`) inside becomes one `cls` line naming
    the operation and the path. Also a decorator."""
    try:
        yield
    except Fp8rlError:
        raise
    except (OSError, *also) as e:
        raise storage_error(e, operation, path, note=note, cls=cls) from e


def one_line(e: BaseException) -> str:
    """What the CLI and every study tool print for an Fp8rlError or an OSError: one line; an
    OS error no I/O boundary named still gets its path and the OS's words."""
    shown = storage_error(e) if isinstance(e, OSError) else e
    return " ".join(str(shown).split())
