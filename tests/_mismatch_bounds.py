"""The mismatch bounds both engines' gates share (docs/rollout.md, "Mismatch gates"): a
precision's format noise, and the KL and token-probability-error bounds a logit error variance
implies. What each engine's pair variance is differs (fp8rl's engine quantizes activations,
vLLM's CPU path quantizes weights only) and stays in its test file."""

import math

import torch

import fp8rl.fp8.linear as fp8_linear
from fp8rl.config.precision import recipe_for
from fp8rl.fp8 import high_precision

EPS32 = 2.0**-24  # float32 unit roundoff


def format_noise(precision: str, weight: bool) -> float:
    """eta: relative RMS error of the precision's quantizer (element format and scale
    granularity) on i.i.d. N(0, 1) data, a property of the format alone (0 in high precision).
    For e4m3 (3 mantissa bits) it is close to the closed form 2^-3 / sqrt(12) / 1.44 ~ 0.025."""
    recipe = recipe_for(precision)
    if recipe is None:
        return 0.0
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    q = fp8_linear.quantize_operand(x, recipe, fmt=recipe.fwd_fmt, weight=weight, name="x")
    return float((q.dequantize() - x).norm() / x.norm())


def bounds(e_sum: float, logit_scale: float) -> tuple[float, float]:
    """(KL bound, token-probability-error bound) for a relative logit error variance e_sum
    summed over the layers: it moves a token's log-prob by delta = dz_y - E_p[dz],
    Var(delta) <= 2 e_sum s^2 for logits of RMS s; k3 KL ~ E[delta^2] / 2 and
    exp|delta| - 1 ~ |delta| <= sqrt(E[delta^2])."""
    var_delta = 2 * e_sum * logit_scale**2
    return var_delta / 2, math.exp(math.sqrt(var_delta))


def logit_scale(model, batch) -> float:
    """s: RMS over the response positions of the high-precision logits' spread across the
    vocabulary (a mean shift cancels in the log-softmax)."""
    with torch.no_grad(), high_precision(model):
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
        ).logits[:, batch.prompt_ids.shape[1] - 1 : -1]
    z = logits[batch.response_mask].float() / batch.temperature
    return float(z.var(-1, unbiased=False).mean().sqrt())
