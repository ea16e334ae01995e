"""Load a local Hugging Face checkpoint folder (e.g. Qwen3-8B-Base as downloaded) safely.

Never touches a model hub and never unpickles: weights must be safetensors. The folder is
checked file by file first so that a broken checkpoint gets an error naming the file at fault
instead of a deep transformers traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fp8rl.errors import CheckpointError, ConfigError

CONFIG_FILE = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Any one of these is enough for AutoTokenizer to build a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def _resolve_dtype(dtype):
    if dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ConfigError("dtype", dtype, f"a torch.dtype, 'auto' or one of {sorted(_DTYPES)}")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{path}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _check_config(folder: Path) -> dict:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE} (not a Hugging Face checkpoint folder)")
    config = _read_json(path)
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise CheckpointError(
            f"{path}: field 'model_type' is missing or empty ({config.get('model_type')!r})"
        )
    return config


def _check_weights(folder: Path) -> None:
    index = folder / SAFETENSORS_INDEX
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: field 'weight_map' is missing, empty or not an object")
        for shard in sorted(set(weight_map.values())):
            if not isinstance(shard, str) or not (folder / shard).is_file():
                raise CheckpointError(f"{index}: lists shard {shard!r}, which is not in {folder}")
        return
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{folder}: only pickle weights ({', '.join(pickles)}); fp8rl loads safetensors only "
            "and never unpickles. Convert them with safetensors' save_file (or "
            "model.save_pretrained(..., safe_serialization=True)) in an environment you trust."
        )
    raise CheckpointError(
        f"{folder}: no weights (no *.safetensors file and no {SAFETENSORS_INDEX})"
    )


def _check_tokenizer(folder: Path) -> None:
    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        raise CheckpointError(
            f"{folder}: no tokenizer (expected one of {', '.join(TOKENIZER_FILES)})"
        )
    for name in present:
        if name.endswith(".json"):
            _read_json(folder / name)


def load_pretrained(path, *, dtype=torch.bfloat16, device="cpu"):
    """Load `(model, tokenizer)` from a local checkpoint folder.

    `dtype` is a torch dtype, a name such as "bfloat16", or "auto" (the checkpoint's own).
    Raises CheckpointError naming the file at fault when the folder is incomplete or
    malformed, or when the weights do not cover every parameter of the model.
    """
    folder = Path(path).expanduser()
    if not folder.exists():
        raise CheckpointError(
            f"{folder}: checkpoint folder does not exist "
            "(fp8rl loads local folders only, no hub ids)"
        )
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: is a file, expected a checkpoint folder")
    torch_dtype = _resolve_dtype(dtype)
    config = _check_config(folder)
    _check_weights(folder)
    _check_tokenizer(folder)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # transformers raises many types; the file set was checked above
        raise CheckpointError(
            f"{folder}: tokenizer files cannot be loaded ({type(e).__name__}: {e})"
        ) from e
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            folder,
            dtype=torch_dtype,
            use_safetensors=True,
            local_files_only=True,
            trust_remote_code=False,
            output_loading_info=True,
        )
    except Exception as e:
        raise CheckpointError(
            f"{folder}: model (model_type {config['model_type']!r}) cannot be loaded "
            f"({type(e).__name__}: {e})"
        ) from e
    # transformers silently initialises missing weights at random: a truncated shard would
    # otherwise train a partly random model.
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise CheckpointError(
            f"{folder}: the safetensors weights lack {len(missing)} parameter(s): {shown}"
        )
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise CheckpointError(
            f"{folder}: the tokenizer has {len(tokenizer)} tokens "
            f"but the model's embedding only {rows} rows"
        )
    return model.to(device), tokenizer
