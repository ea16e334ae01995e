"""Atomic, pruned checkpoints: safetensors for every tensor, JSON for the rest. No pickle.

A checkpoint is a folder `step_XXXXXXXX/` holding `model.safetensors`, `optimizer.safetensors`,
`rng.safetensors` and `state.json`. It is written under a temporary name and renamed into
place, so a crash leaves either the previous checkpoints or the complete new one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from ..errors import CheckpointError

_PREFIX = "step_"
_COMPLETE = "state.json"  # written last: its presence marks a complete checkpoint


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
    meta = {"numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": _jsonable(random.getstate())}
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
    np.random.set_state((name, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, state: dict, keep_last: int = 2,
                    tensors: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Write the checkpoint taken after `step` steps atomically, then prune to `keep_last`.
    `tensors`: further state as named groups of tensors, one `NAME.safetensors` file each
    (e.g. the calibration pool); load_checkpoint returns them as state["tensors"][NAME]."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{_PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{step:08d}-", dir=ckpt_root))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        opt_tensors, opt_meta = _optimizer_tensors(optimizer)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        rng_tensors, rng_meta = _rng_tensors()
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        for name, group in (tensors or {}).items():
            save_file({k: v.detach().contiguous().cpu() for k, v in group.items()},
                      str(tmp / f"{name}.safetensors"))
        payload = {"step": step, "optimizer": opt_meta, "rng": rng_meta, **state,
                   "tensor_files": sorted(tensors or {})}
        with open(tmp / _COMPLETE, "w") as f:
            json.dump(payload, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / _COMPLETE).is_file()]
    return sorted(done, key=lambda p: int(p.name[len(_PREFIX):]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_checkpoint(path: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, restore_rng: bool = True) -> dict:
    """Load weights (and optimizer, RNG) in place; return the JSON state (step, calibration...)."""
    path = Path(path)
    for name in ("model.safetensors", _COMPLETE):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
    try:
        state = json.loads((path / _COMPLETE).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path}: {_COMPLETE} is not valid JSON ({e})") from e
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise CheckpointError(f"checkpoint {path}: model.safetensors does not match the model "
                              f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    load_tensor_files(path, state)
    if optimizer is not None:
        tensors = load_file(str(path / "optimizer.safetensors"))
        optimizer.load_state_dict(_optimizer_from_tensors(tensors, state["optimizer"]))
    if restore_rng and (path / "rng.safetensors").is_file():
        _restore_rng(load_file(str(path / "rng.safetensors")), state["rng"])
    return state


def load_tensor_files(path: Path, state: dict) -> dict:
    """state["tensors"][NAME] from each NAME.safetensors that state.json lists."""
    state["tensors"] = {}
    for name in state.get("tensor_files", []):
        file = path / f"{name}.safetensors"
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {file.name} is missing")
        state["tensors"][name] = load_file(str(file))
    return state


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Weights alone (e.g. the demo's warm start), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_model(model, str(tmp))
    os.replace(tmp, path)


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    missing, unexpected = load_model(model, str(path), strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise CheckpointError(f"weights file {path} does not match the model "
                              f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
