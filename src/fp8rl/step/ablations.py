"""The two research ablations of docs/study.md, behind one log-prob hook.

The step (step.py) calls the plan's hook where it makes log-probs: once after the old pass
(`old`) and once per update (`update`, whose `UpdateHook` the micro-batch loop asks what the
loss sees). A hook draws from the run's `Seeds` only. A production run's hook is `LogProbHook`
itself, which changes nothing, so the step has no ablation branches; each ablation overrides
only what it changes:
  - `RatioNoise` (loss.ratio_noise): Gaussian errors that mimic FP8's, on a BF16 run's old
    and new log-probs; the clean values play the BF16 shadow (no shadow passes);
  - `OracleClip` (loss.clip_source=bf16): the clip decision of the BF16 shadow ratio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..rl.noise import correlated_errors

if TYPE_CHECKING:
    from .records import Seeds, StepData


class UpdateHook:
    """One update's log-probs as the loss sees them; this base changes nothing."""

    def __init__(self, log_prob_shadow: torch.Tensor | None = None):
        self.log_prob_shadow = log_prob_shadow  # shadow pass 2 of the update's rows

    def loss_inputs(
        self, log_prob: torch.Tensor, sl: slice, loss: str, options: dict
    ) -> tuple[torch.Tensor, str, dict]:
        """(log-probs, registered loss, its options) of the micro-batch `sl` of the rows."""
        return log_prob, loss, options

    def shadow(self, clean_log_prob: torch.Tensor) -> torch.Tensor | None:
        """The BF16 shadow of the update's rows, pooled for the shadow phase."""
        return self.log_prob_shadow


class LogProbHook:
    """A production step's log-probs: unchanged. An ablation subclasses it."""

    bf16_passes = True  # False: the hook gives the shadow values (the step skips the passes)

    def old(
        self, seeds: Seeds, old: torch.Tensor, mask: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, object]:
        """(the old log-probs the loss sees, their shadow values or None, what `update` reads
        back of this step as `data.hook_state`)."""
        return old, None, None

    def update(
        self,
        seeds: Seeds,
        data: StepData,
        idx: torch.Tensor,
        k: int,
        step: int,
        log_prob_shadow: torch.Tensor | None,
    ) -> UpdateHook:
        """The hook of update k (rows `idx`; shadow pass 2 of them, at shadow steps)."""
        return UpdateHook(log_prob_shadow)


# ------------------------------------------------------------------ loss.ratio_noise


class RatioNoise(LogProbHook):
    """N(0, sd^2) errors on each pass's log-probs, the old and the new pass's correlated."""

    bf16_passes = False  # the clean values are the shadow (a BF16 run: no extra pass)

    def __init__(self, sd: float, corr: float):
        self.sd, self.corr = sd, corr

    def old(self, seeds, old, mask, step):
        # drawn once per step, as FP8's old-pass error is fixed for all of a step's updates
        _, e_old = correlated_errors(
            old, mask, sd=self.sd, corr=self.corr, generator=seeds.generator(step, "noise/old")
        )
        return old + e_old, old, e_old

    def update(self, seeds, data, idx, k, step, log_prob_shadow):
        e_old = data.hook_state[idx]  # this update's new-pass error, correlated with the old's
        noise, _ = correlated_errors(
            e_old,
            data.batch.response_mask[idx],
            sd=self.sd,
            corr=self.corr,
            generator=seeds.generator(step, f"noise/new/{k}"),
            old_errors=e_old,
        )
        return _NoisedUpdate(noise)


class _NoisedUpdate(UpdateHook):
    def __init__(self, noise: torch.Tensor):
        super().__init__()
        self.noise = noise

    def loss_inputs(self, log_prob, sl, loss, options):
        # a constant offset: the gradient is unchanged, the ratio and the clipping are not
        return log_prob + self.noise[sl], loss, options

    def shadow(self, clean_log_prob):
        return clean_log_prob


# ------------------------------------------------------------------ loss.clip_source=bf16


class OracleClip(LogProbHook):
    """The loss `oracle_clip`: the FP8 ratio's gradient, the BF16 shadow ratio's clip decision."""

    def update(self, seeds, data, idx, k, step, log_prob_shadow):
        return _OracleUpdate(log_prob_shadow, data.old_log_probs_shadow[idx])


class _OracleUpdate(UpdateHook):
    def __init__(self, log_prob_shadow: torch.Tensor, old_log_prob_shadow: torch.Tensor):
        super().__init__(log_prob_shadow)
        self.old_log_prob_shadow = old_log_prob_shadow

    def loss_inputs(self, log_prob, sl, loss, options):
        shadow = {
            "log_prob_shadow": self.log_prob_shadow[sl],
            "old_log_prob_shadow": self.old_log_prob_shadow[sl],
        }
        return log_prob, "oracle_clip", shadow


def log_prob_hook(clip_source: str, noise: tuple[float, float] | None) -> LogProbHook:
    """The run's hook: `clip_source` is loss.clip_source, `noise` loss.ratio_noise resolved to
    (sd, corr)."""
    if noise is not None:
        return RatioNoise(*noise)
    if clip_source == "bf16":
        return OracleClip()
    return LogProbHook()
