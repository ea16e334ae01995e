"""Atomic, self-verifying, pruned checkpoints: safetensors for every tensor, JSON for the rest.
No pickle.

A checkpoint is a folder `step_XXXXXXXX/` holding `model.safetensors`, `optimizer.safetensors`,
`rng.safetensors`, any extra tensor files and `state.json`. It is written under a temporary
name and renamed into place, so a crash leaves either the previous checkpoints or the complete
new one. state.json records the sha256 of every other file; a checkpoint that fails that check
(or whose state.json is unreadable or of the wrong shape, check_writer_state) is moved to
`checkpoints/corrupt/` and the newest intact one is used instead.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from ..errors import CheckpointError, os_errors, storage_error
from ..rl.calibration_state import CalibrationState
from ..utils import sha256_file
from .runlog import EntropySurgeDetector, warn

_PREFIX = "step_"
_COMPLETE = "state.json"  # written last: its presence marks a complete checkpoint
CORRUPT_DIR = "corrupt"  # checkpoints/corrupt/: failed verification, never listed again
_REQUIRED = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{idx}.{name}"] = t.detach().contiguous().cpu()
    return tensors, {"param_groups": sd["param_groups"]}


def _optimizer_from_tensors(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    return {"state": state, "param_groups": meta["param_groups"]}


def _rng_tensors() -> tuple[dict, dict]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    np_state = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(np_state[1].astype(np.int64))
    meta = {
        "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": _jsonable(random.getstate()),
    }
    return tensors, meta


def _jsonable(obj):
    if isinstance(obj, tuple):
        return [_jsonable(x) for x in obj]
    return obj


def _restore_rng(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    name, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state(
        (name, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss)
    )
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    keep_last: int = 2,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write the checkpoint taken after `step` steps atomically, then prune to `keep_last`.
    `tensors`: further state as named groups of tensors, one `NAME.safetensors` file each
    (e.g. the calibration pool); load_checkpoint returns them as state["tensors"][NAME].
    A failed write (disk full, ...) raises CheckpointError and leaves the older ones intact."""
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"{_PREFIX}{step:08d}"
    tmp = None
    try:
        with _writing(final):
            ckpt_root.mkdir(parents=True, exist_ok=True)
            for stale in ckpt_root.glob(".tmp-*"):  # a killed writer's half-written folder
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{step:08d}-", dir=ckpt_root))
            _write_files(tmp, final, step, model, optimizer, state, tensors)
            old = None
            if final.exists():  # moved aside, deleted only once the new one is in place
                old = ckpt_root / f".old-{final.name}-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    # only checkpoints of this run: one above `step` was not written by it (never pick or drop it)
    ours = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) <= step]
    for old in ours[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _writing(path: Path):
    """A failed write (disk full, file too large, permission; OSError or safetensors' own
    error) as one CheckpointError line naming `path` (the final name, not the temporary one)."""
    return os_errors(
        "write checkpoint",
        path,
        note="the older checkpoints are intact",
        cls=CheckpointError,
        also=(SafetensorError,),
    )


def _write_files(tmp: Path, final: Path, step: int, model, optimizer, state: dict, tensors) -> None:
    with _writing(final / "model.safetensors"):
        save_model(model, str(tmp / "model.safetensors"))
    opt_tensors, opt_meta = _optimizer_tensors(optimizer)
    with _writing(final / "optimizer.safetensors"):
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    rng_tensors, rng_meta = _rng_tensors()
    with _writing(final / "rng.safetensors"):
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
    for name, group in (tensors or {}).items():
        with _writing(final / f"{name}.safetensors"):
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in group.items()},
                str(tmp / f"{name}.safetensors"),
            )
    files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
    payload = {
        "step": step,
        "optimizer": opt_meta,
        "rng": rng_meta,
        **state,
        "tensor_files": sorted(tensors or {}),
        "files": files,
    }
    with _writing(final / _COMPLETE), open(tmp / _COMPLETE, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def checkpoint_step(path: Path) -> int:
    return int(path.name[len(_PREFIX) :])


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders (state.json present), oldest first; not yet verified."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.name.startswith(_PREFIX)
        and p.name[len(_PREFIX) :].isdigit()
        and (p / _COMPLETE).is_file()
    ]
    return sorted(done, key=checkpoint_step)


def verify_checkpoint(path: str | Path, check_state: Callable | None = None) -> dict:
    """The checkpoint's state.json after checking its schema (check_writer_state) and every file
    against its recorded sha256; CheckpointError naming the first key or file that is
    missing, unreadable, of the wrong type or changed. `check_state(state, file)`: the
    caller's own keys (the trainer's), checked the same way."""
    path = Path(path)
    file = path / _COMPLETE
    try:
        state = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: {_COMPLETE} is missing") from None
    except OSError as e:
        raise storage_error(e, "read checkpoint", file, cls=CheckpointError) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {file} is not valid JSON ({e})") from None
    named = path.name[len(_PREFIX) :]
    step = int(named) if path.name.startswith(_PREFIX) and named.isdigit() else None
    check_writer_state(state, file, step)
    if check_state is not None:
        check_state(state, file)
    files = state.get("files")
    if files is None:  # written before checkpoints recorded hashes: check presence only
        files = dict.fromkeys(
            [*_REQUIRED, *(f"{n}.safetensors" for n in state.get("tensor_files", []))]
        )
    for name in sorted(set(files) | {"model.safetensors"}):
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        with os_errors("read checkpoint file", f, cls=CheckpointError):
            digest = None if files.get(name) is None else sha256_file(f)
        if digest is not None and digest != files[name]:
            raise CheckpointError(
                f"checkpoint file {f} is corrupt: its sha256 differs from the "
                f"one state.json recorded"
            )
    return state


def find_intact_checkpoint(
    run_dir: str | Path, check_state: Callable | None = None
) -> tuple[Path | None, dict | None, list]:
    """(newest intact checkpoint, its state, [(corrupt newer checkpoint, reason)...]); read only.
    `check_state`: as for verify_checkpoint."""
    corrupt = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return path, verify_checkpoint(path, check_state), corrupt
        except CheckpointError as e:
            corrupt.append((path, str(e)))
    return None, None, corrupt


def quarantine(path: Path, reason: str) -> Path:
    """Move a checkpoint that failed verification to checkpoints/corrupt/, with a warning."""
    dest_root = path.parent / CORRUPT_DIR
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / path.name
    if dest.exists():
        dest = dest_root / f"{path.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    os.replace(path, dest)
    warn(f"skipped {reason}; moved it to {dest}")
    return dest


def latest_checkpoint(run_dir: str | Path, *, move_corrupt: bool = False) -> Path | None:
    """The newest checkpoint that passes verification; newer ones that fail are warned about
    (and, with `move_corrupt`, moved to checkpoints/corrupt/)."""
    path, _, corrupt = find_intact_checkpoint(run_dir)
    for bad, reason in corrupt:
        if move_corrupt:
            quarantine(bad, reason)
        else:
            warn(f"skipped {reason}")
    return path


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    state: dict | None = None,
) -> dict:
    """Verify, then load weights (and optimizer, RNG) in place; return the JSON state (step,
    calibration...). `state`: what verify_checkpoint already returned for this folder."""
    path = Path(path)
    if state is None:
        state = verify_checkpoint(path)
    with _readable(path / "model.safetensors"):
        _load_matching(model, path / "model.safetensors", f"checkpoint {path}: model.safetensors")
    load_tensor_files(path, state)
    if optimizer is not None:
        tensors = read_tensors(path / "optimizer.safetensors")
        with _readable(path / "optimizer.safetensors"):
            optimizer.load_state_dict(_optimizer_from_tensors(tensors, state["optimizer"]))
    if restore_rng and (path / "rng.safetensors").is_file():
        tensors = read_tensors(path / "rng.safetensors")
        with _readable(path / "rng.safetensors"):
            _restore_rng(tensors, state["rng"])
    return state


@contextmanager
def _readable(file: Path):
    """Turn a parse error of a file (one cut short, say) into one CheckpointError line."""
    try:
        yield
    except CheckpointError:
        raise
    except (SafetensorError, OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"checkpoint file {file} is unreadable: {first}") from e


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    with _readable(file):
        return load_file(str(file))


def load_tensor_files(path: Path, state: dict) -> dict:
    """state["tensors"][NAME] from each NAME.safetensors that state.json lists."""
    state["tensors"] = {}
    for name in state.get("tensor_files", []):
        file = path / f"{name}.safetensors"
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {file.name} is missing")
        state["tensors"][name] = read_tensors(file)
    return state


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Weights alone (e.g. the demo's warm start), written atomically."""
    path = Path(path)
    with os_errors("write weights", path, also=(SafetensorError,)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        save_model(model, str(tmp))
        os.replace(tmp, path)


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    with _readable(path):
        _load_matching(model, path, f"weights file {path}")


def _load_matching(model: torch.nn.Module, file: Path, what: str) -> None:
    """Load a safetensors file into `model` in place; CheckpointError naming `what` unless its
    tensor names are exactly the model's (shape mismatches raise from load_model itself)."""
    missing, unexpected = load_model(model, str(file), strict=False)
    # save_model keeps one name of tied tensors, so a tied lm_head.weight may be absent
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise CheckpointError(
            f"{what} does not match the model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )


# ---------------------------------------------------------------- state.json's schema
# What a checkpoint's state.json must hold, checked with its files' hashes before anything
# trusts it. A state.json of the wrong shape (a hand edit, a file from another program, a
# missing key) is a CheckpointError like a hash mismatch: a resume falls back to the newest
# intact checkpoint instead of dying on a KeyError half-way through loading.
# `check_writer_state`: the keys save_checkpoint itself writes (every checkpoint).
# `check_trainer_state`: the keys Trainer.state adds, which a resume restores.

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
