"""What a checkpoint's state.json must hold, checked with its files' hashes before anything
trusts it. A state.json of the wrong shape (a hand edit, a file from another program, a
missing key) is a CheckpointError like a hash mismatch: a resume falls back to the newest
intact checkpoint instead of dying on a KeyError half-way through loading.

`check_writer_state`: the keys save_checkpoint itself writes (every checkpoint).
`check_trainer_state`: the keys Trainer.state adds, which a resume restores.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from ..rl.calibration_state import CalibrationState
from .runlog import EntropySurgeDetector

_MISSING = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bad(file: Path, key: str, value, expected: str) -> CheckpointError:
    found = "missing" if value is _MISSING else f"{type(value).__name__} {value!r}"[:60]
    return CheckpointError(
        f"checkpoint {file}: '{key}' is {found}, expected {expected}: not a state.json fp8rl wrote"
    )


def _need(state: dict, file: Path, key: str, ok, expected: str):
    value = state.get(key, _MISSING)
    if value is _MISSING or not ok(value):
        raise _bad(file, key, value, expected)
    return value


def check_writer_state(state, file: Path, step: int | None = None) -> None:
    """The checkpoint writer's keys have their types; `step`: the one the folder name says.
    `files` and `tensor_files` may be absent (checkpoints written before they existed)."""
    if not isinstance(state, dict):
        raise _bad(file, "(the whole file)", state, "a JSON object")
    found = _need(state, file, "step", lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    if step is not None and found != step:
        raise _bad(file, "step", found, f"{step}, the step of its folder's name")
    optimizer = _need(state, file, "optimizer", lambda v: isinstance(v, dict), "an object")
    _need(
        optimizer,
        file,
        "param_groups",
        lambda v: isinstance(v, list) and all(isinstance(g, dict) for g in v),
        "a list of objects (optimizer.param_groups)",
    )
    rng = _need(state, file, "rng", lambda v: isinstance(v, dict), "an object")
    _need(rng, file, "numpy", _numpy_rng, "[name, pos, has_gauss, gauss] (rng.numpy)")
    _need(rng, file, "python", _python_rng, "[version, [ints], gauss] (rng.python)")
    if "tensor_files" in state:
        _need(
            state,
            file,
            "tensor_files",
            lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
            "a list of names",
        )
    if state.get("files") is not None:
        _need(
            state,
            file,
            "files",
            lambda v: isinstance(v, dict) and all(isinstance(h, str) for h in v.values()),
            "a mapping of file name to sha256",
        )


def _numpy_rng(v) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 4
        and isinstance(v[0], str)
        and _is_int(v[1])
        and _is_int(v[2])
        and _is_number(v[3])
    )


def _python_rng(v) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 3
        and _is_int(v[0])
        and isinstance(v[1], list)
        and all(_is_int(x) for x in v[1])
        and (v[2] is None or _is_number(v[2]))
    )


def check_trainer_state(state: dict, file: Path) -> None:
    """The keys a Trainer restores on resume: each loads into a fresh object of its kind
    (their own validation, not a copy of it), so the real restore cannot fail on them."""
    _need(state, file, "config", lambda v: isinstance(v, dict), "an object (the run config)")
    _need(state, file, "skipped_updates", lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    for key, fresh in (
        ("calibration", lambda: CalibrationState(lower=0.8, upper=1.2)),
        ("entropy_surge", EntropySurgeDetector),
    ):
        value = _need(state, file, key, lambda v: isinstance(v, dict), "an object")
        try:
            fresh().load_state_dict(value)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise CheckpointError(
                f"checkpoint {file}: '{key}' does not load ({first}): not a state.json fp8rl wrote"
            ) from e
