"""FP8 and Calibrated Clipping inside TRL's `GRPOTrainer` (`Fp8GRPOTrainer`).

For users who already train with TRL. What the subclass adds to GRPOTrainer:
  - FP8: the model's linears become `Fp8Linear` (`convert_to_fp8`), so generation and the
    training forward/backward both run in FP8 (one recipe for both phases);
  - Calibrated Clipping: TRL clips the token ratio to [1 - epsilon_low, 1 + epsilon_high];
    before every loss the two epsilons are set from a `CalibrationState`, whose rule (pooled
    by default) refits the bounds at every `interval`-th optimizer step from FP8 ratios and
    their BF16 shadows (the same weights with quantization off, `high_precision`);
  - diagnostics: the clip decomposition every step and the shadow metrics at calibration
    steps, logged through TRL's metrics as `fp8rl/...`.
A TRL generation batch (trained on for `steps_per_generation` x `num_iterations` micro-steps)
plays the part of an fp8rl step, its optimizer steps that of fp8rl's mini-batches. A batch is a
shadow batch when one of its optimizer steps is a shadow step (`shadow_every`, default
`interval`); then: shadow pass 1 gives BF16 old log-probs right after generation (the weights
that sampled), shadow pass 2 BF16 current log-probs next to each FP8 loss forward, and every
loss's tokens are collected. They reach the state (its pool, and a refit at refit steps) when
the next batch is generated; new bounds apply from then on (the last batch of a run is not
used). In multi-process runs (accelerate, torchrun) the pooled tokens are all-gathered in rank
order before the state sees them, so every rank refits on the global batch and clips with the
same bounds; the per-step metrics stay per process, as TRL's own do before it averages them.
Supported: TRL's token-level ratio with the clip losses ("grpo", "bnpo", "dr_grpo", "dapo").
This module imports without trl; the class is built on first use.
"""

from __future__ import annotations

import importlib.util
import math

import torch

from ..fp8 import convert_to_fp8, high_precision
from ..rl.calibration_state import CalibrationState
from ..rl.clipping import clip_decomposition, ratio
from ..rl.shadow import ShadowRows, observe_shadow, shadow_diagnostics
from ..step.parallel import gather_ragged, world_size

CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
_REF_OLD = "fp8rl_old_ref_logps"  # our column in TRL's generation batch
_CLASS = None


def trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def __getattr__(name):  # `from fp8rl.integrations.trl import Fp8GRPOTrainer` builds it lazily
    if name == "Fp8GRPOTrainer":
        return fp8_grpo_trainer_class()
    raise AttributeError(name)


def fp8_grpo_trainer_class():
    global _CLASS
    if _CLASS is None:
        try:
            from trl import GRPOTrainer
        except ImportError as e:
            raise ImportError(
                f"fp8rl.integrations.trl needs TRL: pip install 'trl>=1.16' (import failed: {e})"
            ) from e
        _CLASS = type("Fp8GRPOTrainer", (_Fp8GRPOMixin, GRPOTrainer), {"__module__": __name__})
    return _CLASS


def gather_tokens(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows of shape (1, N_rank) from every process, concatenated in rank order into (1, sum N):
    the same tensors on every rank. In one process (or without torch.distributed initialised,
    as in a plain TRL run) `tensors` itself, untouched."""
    if world_size() < 2:
        return tensors
    names = list(tensors)
    # one collective for all columns; float64 holds float32/bf16 values exactly
    local = torch.stack([tensors[k].reshape(-1).to(torch.float64) for k in names])
    flat = gather_ragged({"tokens": local}, dim=1)["tokens"]
    return {
        k: flat[i].to(tensors[k].device, tensors[k].dtype).reshape(1, -1)
        for i, k in enumerate(names)
    }


def inplace_reload_available() -> bool:
    """Whether the installed vLLM has the in-place (layer-wise) weight reload for live models."""
    try:
        return importlib.util.find_spec("vllm.model_executor.model_loader.reload") is not None
    except ImportError:  # vLLM itself missing
        return False


def reload_colocated(gen) -> None:
    """TRL's colocated weight push, through vLLM's in-place reload rather than TRL's direct
    `model.load_weights` per parameter: the layers vLLM >= 0.32 has processed after loading
    keep no `weight_loader` (TRL's path fails there: "'Parameter' object has no attribute
    'weight_loader'"). The trainer's parameters are pushed as they are (high precision)."""
    if gen.enable_sleep_mode:
        gen.llm.wake_up(tags=["weights"])
        gen._llm_weights_sleeping = False
    gen.llm.collective_rpc(
        "reload_weights",
        kwargs={"weights_iterator": _with_tied_head(gen), "is_checkpoint_format": True},
    )
    gen.llm.reset_prefix_cache()


def _with_tied_head(gen):
    """TRL's (name, tensor) pairs plus a tied `lm_head.weight`, which `named_parameters` leaves
    out: vLLM's reload needs every checkpoint tensor, and without that one the engine ends up
    neither at the old weights nor at the new ones (measured on the CPU build)."""
    names = set()
    for name, tensor in gen._iter_named_params():
        names.add(name)
        yield name, tensor
    head = gen.model.get_output_embeddings()
    if "lm_head.weight" not in names and head is not None:
        yield "lm_head.weight", head.weight.data


def _masked(x, mask):
    return x[mask.bool()].reshape(1, -1)  # pooled tokens as one row: micro-batches differ in T


class _Fp8GRPOMixin:
    """Methods layered over GRPOTrainer; see the module docstring."""

    def __init__(
        self,
        model,
        *args,
        fp8_recipe="rowwise",
        calibration: CalibrationState | None = None,
        calibration_interval: int = 20,
        **kwargs,
    ):
        if isinstance(model, str):
            raise TypeError("Fp8GRPOTrainer: pass a model object (it is converted to FP8 in place)")
        self.fp8_conversion = convert_to_fp8(model, fp8_recipe) if fp8_recipe is not None else None
        super().__init__(model, *args, **kwargs)
        if self.loss_type not in CLIP_LOSSES or self.importance_sampling_level != "token":
            raise ValueError(
                f"Fp8GRPOTrainer: calibrated bounds need a token-level clip loss "
                f"({', '.join(CLIP_LOSSES)}), got loss_type={self.loss_type!r}, "
                f"importance_sampling_level={self.importance_sampling_level!r}"
            )
        nominal = (1 - self.epsilon_low, 1 + self.epsilon_high)
        self.calibration = calibration or CalibrationState(
            lower=nominal[0], upper=nominal[1], nominal=nominal, interval=calibration_interval
        )
        self._pool: list[dict] = []
        self._pool_step: int | None = None
        self._capture: list | None = None
        gen = getattr(self, "vllm_generation", None)
        if gen is not None and gen.mode == "colocate" and inplace_reload_available():
            gen.sync_weights = lambda: reload_colocated(gen)

    # ------------------------------------------------------------ generation: BF16 old log-probs
    def _shadow_step_ahead(self) -> int | None:
        """The shadow step among the optimizer steps trained on this generation batch, if any."""
        a = self.args
        span = math.ceil(
            a.steps_per_generation * self.num_iterations / a.gradient_accumulation_steps
        )
        s = self.state.global_step
        return next(
            (s + k for k in range(max(span, 1)) if self.calibration.is_shadow_step(s + k)), None
        )

    def _generate_and_score_completions(self, inputs):
        if self._pool and self.model.training:  # the previous calibration batch is done
            self._calibrate()
        out = super()._generate_and_score_completions(inputs)
        shadow_step = self._shadow_step_ahead() if self.model.training else None
        if shadow_step is not None:
            self._pool_step = shadow_step
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad(), high_precision(self.model):  # shadow pass 1: the sampling weights
                out[_REF_OLD], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, att, out["completion_ids"].size(1)
                )
        return out

    # ------------------------------------------------------------ the loss with calibrated bounds
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capture is not None:  # the loss forward's FP8 log-probs, for the shadow pool
            self._capture.append(result[0].detach())
        return result

    def _compute_loss(self, model, inputs):
        lower, upper = self.calibration.bounds
        self.epsilon_low, self.epsilon_high = 1 - lower, upper - 1  # read by TRL's clipping
        shadow = model.training and _REF_OLD in inputs
        self._capture = []
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            captured, self._capture = self._capture, None
        self._record(model, inputs, captured[-1], lower, upper, shadow)
        return loss

    def _record(self, model, inputs, log_prob, lower, upper, shadow):
        mode = "train" if model.training else "eval"
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        adv = inputs["advantages"]
        adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(log_prob)
        old = inputs.get("old_per_token_logps")
        old = log_prob if old is None else old
        r = ratio(log_prob, old)
        metrics = {"calib/lower": lower, "calib/upper": upper}
        metrics.update(clip_decomposition(r, adv, mask, lower, upper, prefix=""))
        if shadow:
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            with torch.no_grad(), high_precision(model):  # shadow pass 2: this forward's weights
                lp_shadow, _, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, att, inputs["completion_ids"].size(1)
                )
            old_shadow = inputs[_REF_OLD]
            if inputs.get("old_per_token_logps") is None:  # TRL's on-policy shortcut: old = current
                old_shadow = lp_shadow
            metrics.update(
                shadow_diagnostics(
                    ShadowRows(log_prob, old, lp_shadow, old_shadow, adv, mask),
                    bounds=(lower, upper),
                    nominal=self.calibration.nominal,
                )
            )
            r_shadow = ratio(lp_shadow, old_shadow)
            self._pool.append(
                {
                    "ratio": _masked(r, mask),
                    "ratio_shadow": _masked(r_shadow, mask),
                    "adv": _masked(adv, mask),
                }
            )
        for k, v in metrics.items():
            v = float(v)
            if not math.isnan(v):
                self._metrics[mode][f"fp8rl/{k}"].append(v)

    def _calibrate(self):
        pool, self._pool = self._pool, []
        # every rank reaches this point at the same step (same number of shadow losses), so the
        # collectives line up; identical inputs give identical bounds (the subsample is seeded)
        pooled = gather_tokens(
            {k: torch.cat([p[k] for p in pool], dim=1) for k in ("ratio", "ratio_shadow", "adv")}
        )
        r = pooled["ratio"]
        refit = observe_shadow(
            self.calibration,
            self._pool_step,
            r,
            pooled["ratio_shadow"],
            pooled["adv"],
            torch.ones_like(r, dtype=torch.bool),
        )
        for k, v in refit.items():  # {} at a shadow step that feeds the pool without a refit
            if not math.isnan(float(v)):
                self._metrics["train"][f"fp8rl/{k}"].append(float(v))
