"""Noise injection: Gaussian log-prob errors that mimic FP8's, for a BF16 run.

The model: each pass's log-prob of a token carries an error e ~ N(0, S^2), and the old and
the new pass's errors of the same token have correlation C. The log-ratio's error is then
e_new - e_old with sd S * sqrt(2 (1 - C)): weights that change little between the passes
(C near 1) make nearly the same rounding errors, which cancel in the ratio.

`fp8rl.rl.shadow.estimate_noise` measures S and C from an FP8 run's BF16 shadow passes (the
metrics shadow/logprob_err_sd and shadow/old_new_err_corr);
`fp8rl.config.files.read_noise_calibration` reads them back from a run folder, for
`loss.ratio_noise: {auto: RUN_DIR}`.
"""

from __future__ import annotations

import math

import torch

from ._shapes import as_bool_mask, check_float, check_same_shape


def _check_noise(sd, corr) -> tuple[float, float]:
    sd = check_float("sd", sd, low=0.0, high=math.inf, high_open=True)
    corr = check_float("corr", corr, low=-1.0, high=1.0)
    return sd, corr


def correlated_errors(
    like: torch.Tensor,
    mask: torch.Tensor,
    *,
    sd: float,
    corr: float,
    generator: torch.Generator,
    old_errors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_new, e_old): per-token N(0, sd^2) errors with correlation `corr`, 0 where the mask
    is false, in like's dtype and device. They come from `generator` alone, so the global
    RNG streams, and with them the rollouts, stay those of the run without noise.

    `old_errors`: the old pass's errors drawn earlier (by a first call). In a step with
    several updates the old log-probs are computed once, so their error must stay fixed
    while each update's new pass draws its own, correlated with it:
    e_new = corr * e_old + sd * sqrt(1 - corr^2) * z. Without it both are drawn (two
    standard normal draws of like's shape, e_old's first); with it only z."""
    check_same_shape("like", like, mask=mask, old_errors=old_errors)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    sd, corr = _check_noise(sd, corr)
    m = as_bool_mask(mask).to(like.device)

    def draw():
        # float32 on the generator's device: randn with a generator of another device fails,
        # and a bfloat16 draw would quantise the very noise it models.
        return torch.randn(
            like.shape, generator=generator, device=generator.device, dtype=torch.float32
        )

    if old_errors is None:
        e_old = sd * draw()
    else:
        e_old = old_errors.detach().to(generator.device, torch.float32)
    e_new = corr * e_old + sd * math.sqrt(max(0.0, 1.0 - corr * corr)) * draw()
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    e_new = torch.where(m, e_new.to(like.device, like.dtype), zero)
    e_old = torch.where(m, e_old.to(like.device, like.dtype), zero)
    return e_new, e_old


def ratio_noise_sd(sd: float, corr: float) -> float:
    """The sd of the log-ratio's noise for per-pass error sd `sd` and correlation `corr`."""
    sd, corr = _check_noise(sd, corr)
    return sd * math.sqrt(2.0 * (1.0 - corr))


__all__ = ["correlated_errors", "ratio_noise_sd"]
