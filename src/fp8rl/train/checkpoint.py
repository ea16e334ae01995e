"""Atomic, self-verifying, pruned checkpoints: safetensors for every tensor, JSON for the rest.
No pickle.

A checkpoint is a folder `step_XXXXXXXX/` holding `model.safetensors`, `optimizer.safetensors`,
`rng.safetensors`, any extra tensor files and `state.json`. It is written under a temporary
name and renamed into place, so a crash leaves either the previous checkpoints or the complete
new one. state.json records the sha256 of every other file; a checkpoint that fails that check
(or whose state.json is unreadable or of the wrong shape, state_schema.py) is moved to
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
from ..utils import sha256_file
from .runlog import warn
from .state_schema import check_writer_state

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
    """The checkpoint's state.json after checking its schema (state_schema.py) and every file
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
