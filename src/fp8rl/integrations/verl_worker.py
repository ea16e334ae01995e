"""Calibrated Clipping inside verl 0.9.x engine workers (docs/verl.md).

`Fp8rlTrainingWorker` is verl's `TrainingWorker` with the actor converted to an FP8 recipe
and the two BF16 shadow passes of fp8rl's Calibrated Clipping: at a shadow step, pass 1 runs
beside the FP8 old log-probs in `infer_batch`, pass 2 before each mini-batch update in
`train_batch` (which `train_mini_batch` calls per mini-batch), both forward-only under
`fp8rl.fp8.high_precision` with the same weights. The pooled statistics are all-gathered over
the data-parallel group and fed to the process's `CalibrationState` (the one the registered
`fp8rl_calibrated` loss reads), so every rank adopts the same bounds.
`Fp8rlActorRolloutRefWorker` is verl's `ActorRolloutRefWorker` that builds it as the actor.

Step numbering: fp8rl's step n is the worker's (n+1)-th update (`train_mini_batch` call),
counted by the worker and saved with the calibration state. verl's per-row `global_steps` is
not used: it is when a row's prompt was drawn (v1 trainer, from 1) or its rollout's weight
version (legacy v0 trainer, from 0), and rows of one batch may differ in age.

This module needs verl; `fp8rl.integrations.verl` imports without it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import fields

import torch
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import (
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.padding import no_padding_2_padding

from ..fp8 import as_recipe, convert_to_fp8, high_precision
from ..rl.calibration_state import RUN_FIELDS, CalibrationState
from ..rl.shadow import ShadowRows, shadow_phase
from ..step.parallel import gather_ragged
from . import verl as fv

logger = logging.getLogger(__name__)

DEFAULT_RECIPE = "rowwise"
STATE_FILE = "calibration_state.json"
POOL_FILE = "calibration_pool.safetensors"
# Data keys the worker adds to the update batch: they travel with verl's mini-batch and
# micro-batch splitting to the loss, which the worker wraps to pool them.
OLD_REF_KEY = "fp8rl_old_log_probs_ref"
NEW_REF_KEY = "fp8rl_log_probs_ref"
# the run's part of a state (RUN_FIELDS) is left out: it is not checkpointed, so a resumed
# worker would lose it; the worker's state has shadow steps, refits, and clips at its bounds
_STATE_FIELDS = {f.name for f in fields(CalibrationState)} - {
    "lower",
    "upper",
    "nominal",
    "pool",
    *RUN_FIELDS,
}


def _row_keys(input_ids) -> list[bytes]:
    rows = input_ids.unbind() if input_ids.is_nested else list(input_ids)
    return [r.detach().cpu().numpy().tobytes() for r in rows]


def _in_layout_of(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-row response values (each at least as long as its row of `like`) laid out as
    `like`: jagged with its offsets (verl's v1 trainer), else padded to its width (v0)."""
    if like.is_nested:
        lengths = like.offsets().diff().tolist()
        values = torch.cat([r[:n] for r, n in zip(rows, lengths, strict=True)])
        return torch.nested.nested_tensor_from_jagged(values.to(like.device), like.offsets())
    width = like.shape[-1]
    padded = [torch.nn.functional.pad(r[:width], (0, width - r[:width].numel())) for r in rows]
    return torch.stack(padded).to(like.device)


def _response_log_probs(output, data):
    lp = (output or {}).get("model_output", {}).get("log_probs")
    return None if lp is None else no_padding_2_padding(lp, data).float()


class Fp8rlTrainingWorker(TrainingWorker):
    """verl's TrainingWorker with an FP8 actor and Calibrated Clipping's shadow passes.

    fp8rl settings: the `fp8rl` constructor argument or `config.extra_context["fp8rl"]`, a
    dict with `recipe` (an fp8rl recipe name, or None for no FP8; default rowwise) and any
    CalibrationState field (interval, shadow_every, rule, mode, min_tokens, ...). The nominal
    bounds come from the actor config's clip_ratio_low/high. `calibration` (a CalibrationState)
    overrides the calibration settings.
    """

    def __init__(
        self, config, fp8rl: dict | None = None, calibration: CalibrationState | None = None
    ):
        super().__init__(config)
        extra = getattr(config, "extra_context", None) or {}
        settings = dict(extra.get("fp8rl", {}) or {})
        settings.update(fp8rl or {})
        self.fp8rl_recipe = as_recipe(settings.pop("recipe", DEFAULT_RECIPE))
        unknown = sorted(set(settings) - _STATE_FIELDS)
        if unknown:
            raise ValueError(f"fp8rl settings: unknown key(s) {unknown}")
        self.fp8rl_settings = settings
        self.calibration = calibration
        self.fp8rl_conversion = None
        self.fp8rl_updates = 0  # completed train_mini_batch calls: fp8rl's current step
        self._shadow_old: dict[bytes, torch.Tensor] = {}
        self._pool: list[torch.Tensor] = []
        self._pooling = False

    # ------------------------------------------------------------------ set-up
    @property
    def fp8rl_module(self):
        return self.engine.module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset(self):
        build = getattr(self.engine, "_build_module", None)
        if self.fp8rl_recipe is not None and build is not None:
            # FSDP engines wrap the module right after _build_module: convert before that, so
            # the Fp8Linear swap never replaces sharded modules.
            @functools.wraps(build)
            def build_fp8(*args, **kwargs):
                module = build(*args, **kwargs)
                self.fp8rl_conversion = convert_to_fp8(module, self.fp8rl_recipe)
                return module

            self.engine._build_module = build_fp8
            try:
                super().reset()
            finally:
                del self.engine._build_module
        else:
            super().reset()
            if self.fp8rl_recipe is not None:
                self.fp8rl_conversion = convert_to_fp8(self.fp8rl_module, self.fp8rl_recipe)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn):
        if self.calibration is None:
            actor_config = getattr(loss_fn, "keywords", {}).get("config")
            low, high = fv._clip_range(actor_config) if actor_config is not None else (0.2, 0.2)
            nominal = (1 - low, 1 + high)
            self.calibration = CalibrationState(*nominal, nominal=nominal, **self.fp8rl_settings)
        # the registered loss reads the process's state: make it this worker's
        fv.set_calibration_state(self.calibration)
        mode = fv._get(
            fv._get(getattr(loss_fn, "keywords", {}).get("config"), "policy_loss", {}), "loss_mode"
        )
        if mode not in (None, fv.LOSS_NAME):
            logger.warning(
                "fp8rl: actor.policy_loss.loss_mode=%s ignores the calibrated bounds; set %s",
                mode,
                fv.LOSS_NAME,
            )
        super().set_loss_fn(self._pooling_loss(loss_fn))

    def _pooling_loss(self, loss_fn):
        @functools.wraps(loss_fn)
        def loss(model_output, data, dp_group=None):
            if self._pooling and NEW_REF_KEY in data.keys():
                self._pool_micro_batch(model_output, data)
            return loss_fn(model_output=model_output, data=data, dp_group=dp_group)

        return loss

    def _pool_micro_batch(self, model_output, data):
        """The FP8 log-probs of the update's own forward beside both shadows, masked tokens."""
        with torch.no_grad():
            lp = no_padding_2_padding(model_output["log_probs"], data).detach().float()
            keys = ("response_mask", "old_log_probs", "advantages", OLD_REF_KEY, NEW_REF_KEY)
            d = data.select(*keys).to_padded_tensor()
            m = d["response_mask"].bool()
            adv = d["advantages"].float()
            rows = [lp, d["old_log_probs"], d[NEW_REF_KEY], d[OLD_REF_KEY], adv]
            self._pool.append(torch.stack([x.float()[m] for x in rows]))

    # ------------------------------------------------------------------ steps
    def _state(self) -> CalibrationState:
        if self.calibration is None:
            raise RuntimeError("fp8rl: set_loss_fn runs before the first step (verl does it)")
        return self.calibration

    @register(
        dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False
    )
    def infer_batch(self, data):
        ref_pass = bool(tu.get(data, key="no_lora_adapter", default=False))
        compute_loss = tu.get(data, key="compute_loss", default=True)
        # these old log-probs serve the coming update: its step is the updates done so far
        shadow = (
            not ref_pass
            and not compute_loss
            and self.calibration is not None
            and self._state().is_shadow_step(self.fp8rl_updates)
        )
        output = super().infer_batch(data)
        if not shadow:
            return output
        # pass 1: the BF16 old log-probs of the same weights, beside the FP8 ones
        disable_auto_offload = tu.get(data, key="disable_auto_offload", default=False)
        with (
            self.engine.eval_mode(disable_auto_offload=disable_auto_offload),
            high_precision(self.fp8rl_module),
            torch.no_grad(),
        ):
            ref = self.engine.infer_batch(data, loss_function=None)
        lp_shadow = _response_log_probs(ref, data)
        if lp_shadow is not None:  # ranks without outputs (pipeline stages) keep nothing
            self._shadow_old = dict(zip(_row_keys(data["input_ids"]), lp_shadow.cpu(), strict=True))
        return output

    def _attach_old_shadow(self, data) -> bool:
        keys = _row_keys(data["input_ids"])
        if not self._shadow_old or any(k not in self._shadow_old for k in keys):
            return False
        rows = [self._shadow_old[k] for k in keys]
        data[OLD_REF_KEY] = _in_layout_of(rows, data["old_log_probs"])
        return True

    @register(
        dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False
    )
    def train_mini_batch(self, data):
        state = self._state()
        step = self.fp8rl_updates
        shadow = state.is_shadow_step(step)
        attached = shadow and self._attach_old_shadow(data)
        if shadow and not attached:
            logger.warning(
                "fp8rl: step %d is a shadow step but no BF16 old log-probs were recorded "
                "for this batch (was the actor's compute_log_prob skipped?): no calibration",
                step,
            )
        self._pool, self._pooling = [], attached
        try:
            output = super().train_mini_batch(data)
        finally:
            self._pooling = False
            self._shadow_old = {}
        self.fp8rl_updates += 1
        lower, upper = state.bounds  # the bounds this step's updates clipped with
        extra = {"calib/shadow_step": float(attached)}
        if attached:
            extra.update(self._calibrate(step))
        extra.update({"calib/lower": lower, "calib/upper": upper})
        self._pool = []
        if output is None:
            return None
        metrics = dict(tu.get(output, "metrics"))
        metrics.update(extra)
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}).cpu()

    @register(
        dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False
    )
    def train_batch(self, data):
        if self._pooling and OLD_REF_KEY in data.keys():
            self._shadow_pass_2(data)
        return super().train_batch(data)

    def _shadow_pass_2(self, data):
        """BF16 log-probs of this mini-batch with the weights about to be updated."""
        probe = data.clone(recurse=False)
        defaults = dict(
            use_remove_padding=self.model_config.get("use_remove_padding", False),
            use_dynamic_bsz=self.engine_config.use_dynamic_bsz,
            max_token_len_per_gpu=self.engine_config.infer_max_token_len_per_gpu,
            micro_batch_size_per_gpu=self.engine_config.infer_micro_batch_size_per_gpu,
            use_fused_kernels=self.engine_config.use_fused_kernels,
            calculate_entropy=False,
            compute_loss=False,
        )
        tu.assign_non_tensor(probe, **defaults)
        with (
            self.engine.eval_mode(disable_auto_offload=True),
            high_precision(self.fp8rl_module),
            torch.no_grad(),
        ):
            out = self.engine.infer_batch(probe, loss_function=None)
        lp_shadow = _response_log_probs(out, probe)
        if lp_shadow is not None:
            data[NEW_REF_KEY] = _in_layout_of(list(lp_shadow), data["old_log_probs"])

    def _calibrate(self, step: int) -> dict:
        """The shadow core on the pooled tokens of every data-parallel rank."""
        state = self._state()
        local = torch.cat(self._pool, dim=1) if self._pool else torch.zeros(5, 0)
        group = self.engine.get_data_parallel_group()
        pooled = gather_ragged({"pool": local}, dim=1, group=group)["pool"].cpu().double()
        lp, old, lp_shadow, old_shadow, adv = pooled
        rows = ShadowRows(
            lp, old, lp_shadow, old_shadow, adv, torch.ones_like(lp, dtype=torch.bool)
        )
        metrics = shadow_phase(rows, state=state, step=step, bounds=state.bounds)
        out = {"calib/shadow_tokens": float(lp.numel())}
        if "calib/next_lower" in metrics:
            out["calib/refit"] = 1.0
        # an undefined fraction (NaN: no such tokens, or none pooled) stays out of the logs
        out.update({k: float(v) for k, v in metrics.items() if math.isfinite(float(v))})
        return out

    # ------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        out = super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if self.calibration is None or local_path is None:
            return out
        dist = torch.distributed
        if dist.is_initialized() and dist.get_rank() != 0:
            return out  # every rank holds the same state
        from safetensors.torch import save

        from ..utils import atomic_write_bytes, atomic_write_text

        os.makedirs(local_path, exist_ok=True)
        blob = {"state": self.calibration.state_dict(), "fp8rl_updates": self.fp8rl_updates}
        atomic_write_text(os.path.join(local_path, STATE_FILE), json.dumps(blob, indent=1))
        pool = save(self.calibration.pool_tensors())
        atomic_write_bytes(os.path.join(local_path, POOL_FILE), pool)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        path = os.path.join(local_path, STATE_FILE) if local_path else None
        blob = None
        if path and os.path.exists(path):  # read first: verl may delete the local copy
            from safetensors.torch import load_file

            with open(path) as f:
                blob = json.load(f)
            pool_path = os.path.join(local_path, POOL_FILE)
            pool = load_file(pool_path) if os.path.exists(pool_path) else {}
        out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        if blob is not None:
            if self.calibration is None:
                self.calibration = CalibrationState(0.8, 1.2)
            self.calibration.load_state_dict(blob["state"])
            self.calibration.load_pool_tensors(pool)
            self.fp8rl_updates = int(blob.get("fp8rl_updates", 0))
            fv.set_calibration_state(self.calibration)
        return out


class Fp8rlActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's ActorRolloutRefWorker whose actor is an Fp8rlTrainingWorker (the ref model,
    the frozen initial policy, stays verl's TrainingWorker). fp8rl settings come from the
    `fp8rl` block of the worker config (`+actor_rollout_ref.fp8rl.recipe=rowwise`, ...)."""

    actor_worker_cls = Fp8rlTrainingWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        settings = self.config.get("fp8rl", None)
        if settings is not None and not isinstance(settings, dict):
            from omegaconf import OmegaConf

            settings = OmegaConf.to_container(settings, resolve=True)
        self.actor_worker_cls = functools.partial(Fp8rlTrainingWorker, fp8rl=settings or {})
        return super().init_model()


SEPARATE_ASYNC_REFUSAL = (
    "fp8rl: trainer.v1.trainer_mode=separate_async (and verl.experimental's fully_async_policy "
    "and one_step_off_policy) build verl's DetachActorWorker, not fp8rl's worker, so neither "
    "FP8 training nor the shadow passes would run; allowed: trainer.v1.trainer_mode=sync or "
    "colocate_async"
)


class Fp8rlRefusedDetachActorWorker(DetachActorWorker):
    """What verl's separated trainers build as the actor once fp8rl is installed."""

    def __init__(self, *args, **kwargs):
        raise ValueError(SEPARATE_ASYNC_REFUSAL)


def install() -> None:
    """Make verl's PPO trainers build Fp8rlActorRolloutRefWorker: the trainers import
    ActorRolloutRefWorker from verl.workers.engine_workers by name, so rebind it there (and in
    an already imported v1 trainer_base). verl's separated trainers build their own
    DetachActorWorker whatever worker they were given: rebind that to a class that refuses,
    rather than let fp8rl's settings be silently ignored. Run in the process that builds the trainer
    (verl's TaskRunner): `VERL_USE_EXTERNAL_MODULES=fp8rl.integrations.verl_plugin` does that."""
    import sys

    import verl.experimental.separation.engine_workers as sep
    import verl.workers.engine_workers as ew

    ew.ActorRolloutRefWorker = Fp8rlActorRolloutRefWorker
    base = sys.modules.get("verl.trainer.ppo.v1.trainer_base")
    if base is not None:
        base.ActorRolloutRefWorker = Fp8rlActorRolloutRefWorker
    sep.DetachActorWorker = Fp8rlRefusedDetachActorWorker
    separate = sys.modules.get("verl.trainer.ppo.v1.trainer_separate_async")
    if separate is not None:
        separate.DetachActorWorker = Fp8rlRefusedDetachActorWorker
