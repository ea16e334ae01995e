"""A CPU platform and a stand-in engine for verl 0.9.x, for the worker tests only.

verl 0.9.1 has no CPU platform (it reports "cuda" and asks for nccl) and registers its FSDP
engines for cuda/npu only. The stand-in is the smallest BaseEngine the TrainingWorker drives:
a plain HF model and AdamW, verl's own micro-batching (prepare_micro_batches) and output
assembly (postprocess_batch_func). It is not FSDP: tests through it check fp8rl's wiring.
"""

import os
from contextlib import contextmanager

import torch

BACKEND = "fp8rl_cpu"


def _cpu_device_module():
    # verl's FlopsCounter recognises torch.cpu; the worker's memory metrics need these two
    for name in ("max_memory_allocated", "max_memory_reserved"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *a, **k: 0)
    return torch.cpu


def install_cpu_platform():
    from verl.plugin.platform import platform_manager as pm
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class PlatformCPU(PlatformCUDA):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _cpu_device_module()

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return True

        def current_device(self):
            return 0

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

        def empty_cache(self):
            pass

        def communication_backend_name(self):
            return "gloo"

        def get_device_capability(self, device_index=0):
            return (None, None)

    pm.set_platform(PlatformCPU())


def init_gloo():
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def register_engine():
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import BaseEngine, EngineRegistry
    from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches

    if BACKEND in EngineRegistry._engines.get("language_model", {}):
        return

    @EngineRegistry.register(model_type="language_model", backend=BACKEND, device="cpu")
    class CpuEngine(BaseEngine):
        def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config):
            self.model_config, self.engine_config = model_config, engine_config
            self.optimizer_config, self.checkpoint_config = optimizer_config, checkpoint_config
            self.module, self.mode = None, None

        def initialize(self):
            from transformers import AutoModelForCausalLM

            self.module = AutoModelForCausalLM.from_pretrained(
                self.model_config.local_path, dtype=torch.float32
            )
            self.optimizer = torch.optim.AdamW(
                self.module.parameters(),
                lr=self.optimizer_config.lr,
                weight_decay=self.optimizer_config.weight_decay,
            )

        is_param_offload_enabled = False
        is_optimizer_offload_enabled = False

        @contextmanager
        def _mode(self, mode, **kwargs):
            self.mode = mode
            self.module.train(mode == "train")
            try:
                yield
            finally:
                if mode == "train":
                    self.optimizer.zero_grad()
                self.mode = None

        def train_mode(self, **kwargs):
            return self._mode("train")

        def eval_mode(self, **kwargs):
            return self._mode("eval")

        def optimizer_zero_grad(self):
            self.optimizer.zero_grad()

        def optimizer_step(self):
            clip = self.optimizer_config.clip_grad
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm=clip)
            self.optimizer.step()
            return norm.item()

        def lr_scheduler_step(self):
            return self.optimizer.param_groups[0]["lr"]

        def get_data_parallel_size(self):
            return torch.distributed.get_world_size()

        def get_data_parallel_rank(self):
            return torch.distributed.get_rank()

        def get_data_parallel_group(self):
            return torch.distributed.group.WORLD

        def is_mp_src_rank_with_outputs(self):
            return True

        def to(self, device, model=True, optimizer=True, grad=True):
            pass

        def _log_probs(self, micro_batch):
            vals = []
            for ids, pos in zip(
                micro_batch["input_ids"].unbind(), micro_batch["position_ids"].unbind(), strict=True
            ):
                logits = self.module(input_ids=ids[None], position_ids=pos[None]).logits[0].float()
                lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
                vals.append(torch.cat([lp, lp.new_zeros(1)]))
            offsets = micro_batch["input_ids"].offsets()
            return torch.nested.nested_tensor_from_jagged(torch.cat(vals), offsets=offsets)

        def forward_backward_batch(self, data, loss_function, forward_only=False):
            group = self.get_data_parallel_group()
            n_tok = data["loss_mask"].sum()
            torch.distributed.all_reduce(n_tok, group=group)
            tu.assign_non_tensor(data, batch_num_tokens=n_tok.item())
            tu.assign_non_tensor(data, dp_size=self.get_data_parallel_size())
            micro_batches, indices = prepare_micro_batches(data=data, dp_group=group)
            outputs = []
            for mb in micro_batches:
                model_output = {"log_probs": self._log_probs(mb)}
                if loss_function is not None:
                    loss, metrics = loss_function(
                        model_output=model_output, data=mb, dp_group=group
                    )
                else:
                    loss, metrics = torch.tensor(1.0), {}
                if not forward_only:
                    loss.backward()
                model_output = {k: v.detach() for k, v in model_output.items()}
                outputs.append(
                    {"model_output": model_output, "loss": loss.item(), "metrics": metrics}
                )
            return postprocess_batch_func(output_lst=outputs, indices=indices, data=data)

        def save_checkpoint(
            self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None, **kw
        ):
            os.makedirs(local_path, exist_ok=True)
            state = {"model": self.module.state_dict(), "optim": self.optimizer.state_dict()}
            torch.save(state, os.path.join(local_path, "standin.pt"))

        def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=True, **kw):
            state = torch.load(os.path.join(local_path, "standin.pt"))
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optim"])


def setup():
    torch.set_num_threads(1)
    install_cpu_platform()
    init_gloo()
    register_engine()
