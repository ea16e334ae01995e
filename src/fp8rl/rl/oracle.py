"""Oracle clipping: the clip decision of the BF16 shadow, the gradient of FP8.

Per token, with rhat the BF16 shadow ratio and r the FP8 one, at the bounds (L, H) in use:

    A < 0 and rhat < L:  -L A   (a constant: no gradient)
    A > 0 and rhat > H:  -H A   (a constant: no gradient)
    otherwise:           -A r   (gradient through the FP8 log-prob)

Its FP8-vs-BF16 clip excess is 0 by construction; what is left of FP8's effect on training
is the noise in the surrogate's gradient. If a run with it behaves like BF16, over-clipping
is the channel through which FP8 noise acts. With rhat == r it is PPO-clip without dual
clip, value and gradient.

Registered as the policy loss "oracle_clip" (the package fp8rl.rl imports this module):

    policy_loss("oracle_clip", log_prob, old_log_prob, advantages, mask, lower=L, upper=H,
                log_prob_shadow=lp_bf16, old_log_prob_shadow=old_bf16)
"""

from __future__ import annotations

import torch

from fp8rl.utils import masked_mean

from ._shapes import check_same_shape
from .clipping import clip_metrics, lower_clipped, ratio, upper_clipped
from .registry import Metrics, register_policy_loss


@register_policy_loss("oracle_clip")
def oracle_clip(
    lp, old, adv, m, *, lower, upper, log_prob_shadow=None, old_log_prob_shadow=None
) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip whose clip masks come from the BF16 shadow ratio exp(log_prob_shadow -
    old_log_prob_shadow), both detached. actor/clipfrac_* report the clips applied (the
    shadow's); actor/oracle_fp8_clipfrac what the FP8 ratio would have clipped and
    actor/oracle_flip_frac the share of tokens on which the two decisions differ."""
    if log_prob_shadow is None or old_log_prob_shadow is None:
        raise ValueError(
            "policy loss 'oracle_clip' needs log_prob_shadow and old_log_prob_shadow "
            "(the BF16 shadow passes of the current and the old policy)"
        )
    check_same_shape(
        "log_prob", lp, log_prob_shadow=log_prob_shadow, old_log_prob_shadow=old_log_prob_shadow
    )
    zero = torch.zeros_like(lp)
    # policy_loss neutralises only its own inputs; a padded shadow value (-inf) would give
    # a NaN ratio, which the clip masks would not exclude.
    lp_shadow = torch.where(m, log_prob_shadow.detach().to(lp.dtype), zero)
    old_shadow = torch.where(m, old_log_prob_shadow.detach().to(lp.dtype), zero)

    r = ratio(lp, old)
    r_shadow = ratio(lp_shadow, old_shadow)
    low = lower_clipped(r_shadow, adv, m, lower)
    up = upper_clipped(r_shadow, adv, m, upper)
    weight = torch.where(low, lower, torch.where(up, upper, r))
    loss = -adv * weight

    rd = r.detach()
    metrics = clip_metrics(rd, adv, m, lower, upper, old, lp)
    fp8_clip = lower_clipped(rd, adv, m, lower) | upper_clipped(rd, adv, m, upper)
    f = rd.dtype
    metrics["actor/oracle_fp8_clipfrac"] = metrics["actor/clipfrac"]
    metrics["actor/clipfrac_lower_neg"] = masked_mean(low.to(f), m).detach()
    metrics["actor/clipfrac_upper_pos"] = masked_mean(up.to(f), m).detach()
    metrics["actor/clipfrac"] = masked_mean((low | up).to(f), m).detach()
    metrics["actor/oracle_flip_frac"] = masked_mean((fp8_clip != (low | up)).to(f), m).detach()
    return loss, metrics
