"""GSPO: PPO-clip on the sequence ratio (docs/rl.md, "Policy losses").

Per response i, s_i = exp(min(mean_t log r_it, 10)) (clipping.sequence_ratio), and per token

    w_it = sg(s_i) * r_it / sg(r_it)        (the value s_i, the gradient s_i d log p_it)
    A < 0 and s_i < L:  -L A   (a constant: no gradient)
    A > 0 and s_i > H:  -H A   (a constant: no gradient)
    otherwise:          -A w_it

so a clipped response loses the gradient of all its tokens together. The clamp at 10 applies
to the token's log w_it, as in verl's `compute_policy_loss_gspo`, which this equals in value
and gradient (tests/test_integrations_verl.py). Registered as "gspo"; the package fp8rl.rl
imports this module.
"""

from __future__ import annotations

import torch

from ._shapes import require_2d
from .clipping import (
    SEQ_LOG_RATIO_MAX,
    clip_metrics,
    lower_clipped,
    sequence_log_ratio,
    upper_clipped,
)
from .registry import Metrics, register_policy_loss


@register_policy_loss("gspo")
def gspo(lp, old, adv, m, *, lower, upper) -> tuple[torch.Tensor, Metrics]:
    """GSPO's clipped surrogate at bounds (lower, upper) (GSPO's own: 1 - 3e-4, 1 + 4e-4).
    Needs (B, T) rows. The actor/clipfrac_* metrics count the tokens of clipped responses."""
    require_2d("log_prob", lp, "policy loss 'gspo' (a sequence ratio)")
    seq = sequence_log_ratio(lp.detach(), old, m)
    # log w = sg(log s) + log p - sg(log p): the value is log s exactly (log p - sg(log p) is 0)
    log_w = (lp - lp.detach() + seq.unsqueeze(-1)).clamp(max=SEQ_LOG_RATIO_MAX)
    w = torch.exp(log_w)
    s = w.detach()  # s_i on every token of row i
    low = lower_clipped(s, adv, m, lower)
    up = upper_clipped(s, adv, m, upper)
    loss = -adv * torch.where(low, lower, torch.where(up, upper, w))
    return loss, clip_metrics(s, adv, m, lower, upper, old, lp)
