"""Data-parallel training on torch.distributed (`torchrun --nproc-per-node N -m fp8rl train`).

Every rank runs the same step loop on a contiguous share of the step's prompt groups.
Exactness with one process on the same global batch comes from four rules:
  - the mini-batch shuffle is drawn over the global row count, each rank keeps its rows;
  - loss weights use the global token / row counts of the mini-batch, and gradients are
    SUMMED across ranks (explicit all-reduce, or FSDP2 with divide factor 1);
  - Algorithm 1 and the shadow diagnostics run on the rows gathered from every rank;
  - metrics are reduced as global means weighted by rows or tokens.
Strategies: "fsdp2" (torch.distributed.fsdp.fully_shard, the default on CUDA) and
"allreduce" (replicated weights, one flat all-reduce of the gradients per update, the
default on the CPU / gloo, where it is cheaper and FP8 emulation has no sharding benefit).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..fp8 import fp8_linears
from ..step.parallel import SingleProcess, gather_ragged, share
from .build import make_optimizer
from .trainer import Trainer

STRATEGIES = ("auto", "allreduce", "fsdp2")


class DataParallel(SingleProcess):
    """The collectives of `SingleProcess`'s seams; `device` is where gloo/NCCL tensors live."""

    def __init__(self, strategy: str, device: torch.device):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.strategy = strategy
        self.device = device

    def barrier(self) -> None:
        dist.barrier()

    def _t(self, values, dtype=torch.float64) -> torch.Tensor:
        return torch.as_tensor(values, dtype=dtype).to(self.device)

    # ------------------------------------------------------------ batch layout
    def share(self, n_groups):
        if n_groups < self.world_size:
            raise ConfigError(
                "rollout.prompts_per_step",
                n_groups,
                f"at least the number of ranks ({self.world_size})",
            )
        return share(n_groups, self.world_size, self.rank)

    def _counts(self, n: int) -> list[int]:
        counts = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
        counts[self.rank] = n
        dist.all_reduce(counts)
        return counts.tolist()

    def row_offset(self, n_rows):
        counts = self._counts(n_rows)
        return sum(counts[: self.rank]), sum(counts)

    def pad_responses(self, batch):
        """Pad responses to the widest on any rank: one T everywhere (Dr. GRPO's norm_len)."""
        width = torch.tensor([batch.response_ids.shape[1]], device=self.device)
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
        extra = int(width) - batch.response_ids.shape[1]
        if extra == 0:
            return batch
        from dataclasses import replace

        padded = {
            name: torch.nn.functional.pad(getattr(batch, name), (0, extra), value=value)
            for name, value in (
                ("response_ids", batch.pad_token_id),
                ("response_mask", False),
                ("log_probs", 0.0),
                ("entropy", 0.0),
                ("full_log_probs", 0.0),
            )
            if getattr(batch, name) is not None
        }
        return replace(batch, **padded)

    # ------------------------------------------------------------ reductions
    def mean_metrics(self, metrics, weights, max_keys=()):
        keys = [k for k in metrics if k in weights and k not in max_keys]
        out = dict(metrics)
        if keys:
            w = torch.stack([self._t(float(weights[k])) for k in keys])
            v = torch.stack([self._t(float(metrics[k])) for k in keys])
            buf = torch.cat([torch.where(w > 0, v * w, torch.zeros_like(v)), w])
            dist.all_reduce(buf)
            num, den = buf[: len(keys)], buf[len(keys) :]
            out.update(
                zip(keys, (num / den).tolist(), strict=True)
            )  # 0 / 0 = NaN: no rank had any weight
        mx = [k for k in max_keys if k in metrics]
        if mx:
            buf = torch.stack([self._t(float(metrics[k])) for k in mx])
            dist.all_reduce(buf, op=dist.ReduceOp.MAX)
            out.update(zip(mx, buf.tolist(), strict=True))
        return out

    def sum(self, value):
        out = value.detach().clone()
        dist.all_reduce(out)
        return out

    def sum_int(self, value):
        return int(self.sum(self._t([value], torch.int64))[0])

    def sum_dict(self, values):
        # a rank without rows in a mini-batch has no metrics: agree on the keys first
        names: list = [None] * self.world_size
        dist.all_gather_object(names, sorted(values))
        keys = sorted(set().union(*names))
        if not keys:
            return {}
        like = next(iter(values.values()), None)
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        # on the device: the step reads the sums back in its one transfer per mini-batch
        buf = torch.stack(
            [values[k].to(self.device, torch.float64) if k in values else zero for k in keys]
        )
        dist.all_reduce(buf)
        where = like.device if like is not None else self.device
        return {k: v.to(where) for k, v in zip(keys, buf.unbind(), strict=True)}

    def gather_rows(self, tensors):
        return gather_ragged(tensors)

    # ------------------------------------------------------------ model hooks
    def unshard(self, model):
        if self.strategy == "fsdp2":  # later forwards run without collectives, in any number
            for m in _fsdp_modules(model):  # unshard() is not recursive
                m.unshard()
            # the all-gather writes behind the version counter the FP8 weight caches are keyed
            # on: a cache could outlive an update (same storage, same version), so drop them
            for layer in fp8_linears(model):
                layer.invalidate_weight_cache()

    def backward(self, model, loss, *, last):
        if self.strategy == "fsdp2":  # accumulate locally, reduce-scatter once per update
            model.set_requires_gradient_sync(last)
        loss.backward()

    def finish_backward(self, model, had_backward, zero_loss=None):
        if self.strategy == "fsdp2":
            if not had_backward:  # the reduce-scatter is collective: join it with zero gradients
                self.backward(model, zero_loss(), last=True)
            # the reduced gradients live on the sharded parameters, which an unsharded module
            # does not expose: parameters() (clipping) would see the gradient-less full ones
            for m in _fsdp_modules(model):
                m.reshard()
            return
        params = [p for p in model.parameters() if p.requires_grad]
        # a parameter without a gradient on every rank stays without one (AdamW skips it)
        has = self._t([float(p.grad is not None) for p in params])
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        for p, h in zip(params, has.tolist(), strict=True):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def clip_gradients(self, model, max_norm):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def optimizer_step(self, model, optimizer):
        optimizer.step()  # fsdp2: on the shards; the next unshard() gathers the new weights


def _fsdp_modules(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _apply_fsdp2(model) -> None:
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", [])
    # params stay gathered between forward and backward; unshard()/reshard() bracket phases
    for layer in layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    for m in [*layers, model]:
        m.set_gradient_divide_factor(1.0)  # a sum, like the all-reduce strategy
        # as a plain SUM (then x1.0, exact): gloo has no PREMUL_SUM, which factor 1 would use
        m.set_force_sum_reduction_for_comms(True)
        m.set_reshard_after_backward(False)


def resolve_strategy(strategy: str, device: torch.device) -> str:
    if strategy not in STRATEGIES:
        raise ConfigError("FP8RL_DP_STRATEGY", strategy, f"one of {', '.join(STRATEGIES)}")
    if strategy == "auto":
        return "fsdp2" if device.type == "cuda" else "allreduce"
    return strategy


def init_from_env() -> bool:
    """Join the process group torchrun describes (WORLD_SIZE > 1); False when not launched so."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return True


def shutdown() -> None:
    """Leave the process group before exit: a gloo/NCCL group torn down by interpreter exit
    can abort the process (a rank finishing early then fails the whole torchrun job)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class DistributedTrainer(Trainer):
    """A Trainer on every rank of an initialised process group."""

    wait_for_warm_start = True  # one rank builds a missing warm start, the others then load it

    def __init__(self, cfg, *, progress=None, strategy: str | None = None, resuming=False):
        if not dist.is_initialized():
            raise RuntimeError(
                "DistributedTrainer needs torch.distributed initialised (use torchrun)"
            )
        if cfg.rollout.engine != "fp8rl":  # one colocated vLLM per process is not built yet
            raise ConfigError(
                "rollout.engine", cfg.rollout.engine, "'fp8rl' in a data-parallel (torchrun) run"
            )
        super().__init__(cfg, progress=progress, resuming=resuming)
        strategy = resolve_strategy(
            strategy or os.environ.get("FP8RL_DP_STRATEGY", "auto"), self.device
        )
        comm_device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.dp = DataParallel(strategy, comm_device)
        self.rollout_shards = self.dp.world_size
        for p in self.model.parameters():  # identical starting weights whatever each rank built
            dist.broadcast(p.data, src=0)
        if strategy == "fsdp2":
            _apply_fsdp2(self.model)
            self.optimizer = make_optimizer(self.model, cfg)  # over the sharded parameters
        msg = (
            f"data parallel: {self.dp.world_size} ranks, strategy {strategy}, "
            f"backend {dist.get_backend()}"
        )
        if self.dp.is_main:
            print(msg, flush=True)
        self.startup_events.append(msg)  # fit logs it once the run folder is checked

    # ------------------------------------------------------------ checkpoints
    def save(self):
        if self.dp.strategy != "fsdp2":
            return super().save()
        from .checkpoint import save_checkpoint

        model_sd, opt = _full_state(self.model, self.optimizer)  # collective: every rank
        path = None
        if self.dp.is_main:
            path = save_checkpoint(
                self.run_dir,
                self.step,
                _StateOf(model_sd),
                _StateOf(opt),
                self.state(),
                keep_last=self.cfg.log.keep_last,
                tensors=self.state_tensors(),
            )
        dist.barrier()
        return path

    def load_checkpoint(self, path, state):
        if self.dp.strategy != "fsdp2":
            return super().load_checkpoint(path, state)
        return _load_full_state(path, self.model, self.optimizer, state=state)

    def evaluate(self, split: str = "test") -> dict:
        self.dp.unshard(self.model)  # collective; then only rank 0 generates
        return super().evaluate(split) if self.dp.is_main else {}


class _StateOf:
    """What save_checkpoint needs of a model or optimizer: its state_dict()."""

    def __init__(self, sd):
        self._sd = sd

    def state_dict(self):
        return self._sd


def _full_state(model, optimizer):
    """Full (unsharded) CPU state dicts; the optimizer's in the index-keyed torch layout."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    # gathered tensors are views of a larger buffer, which safetensors refuses to save; own
    # copies, with a tied weight (lm_head = embed_tokens) kept once as single-process saves do
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    tied = set(names) - {n for n, _ in model.named_parameters()}
    model_sd = {k: v.clone() for k, v in model_sd.items() if k not in tied}
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if not osd:  # cpu_offload gathers to rank 0 only; the others get {}
        return model_sd, {}
    order = [fqn for g in osd["param_groups"] for fqn in g["params"]]
    index = {fqn: i for i, fqn in enumerate(order)}
    groups = [{**g, "params": [index[f] for f in g["params"]]} for g in osd["param_groups"]]
    return model_sd, {
        "state": {index[f]: s for f, s in osd["state"].items()},
        "param_groups": groups,
    }


def _load_full_state(ckpt, model, optimizer, state: dict | None = None) -> dict:
    """Load a (verified) checkpoint into FSDP2-sharded modules; `state` as verify_checkpoint
    returned it (verified here when None)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from .checkpoint import (
        _optimizer_from_tensors,
        load_tensor_files,
        read_tensors,
        verify_checkpoint,
    )

    if state is None:
        state = verify_checkpoint(ckpt)
    load_tensor_files(ckpt, state)
    model_sd = read_tensors(ckpt / "model.safetensors")
    saved = _optimizer_from_tensors(
        read_tensors(ckpt / "optimizer.safetensors"), state["optimizer"]
    )
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, model_sd, options=opts)
    fqns = [
        f for g in get_optimizer_state_dict(model, optimizer)["param_groups"] for f in g["params"]
    ]
    groups = [{**g, "params": [fqns[i] for i in g["params"]]} for g in saved["param_groups"]]
    set_optimizer_state_dict(
        model,
        optimizer,
        {"state": {fqns[i]: s for i, s in saved["state"].items()}, "param_groups": groups},
        options=opts,
    )
    return state
