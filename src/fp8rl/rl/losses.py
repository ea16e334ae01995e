"""Policy losses (docs/rl.md, "Policy losses"): `policy_loss`, which checks, neutralises and
aggregates for every registered loss (rl/registry.py), and the built-in ppo_clip, cispo, bapo.

Every loss returns (scalar loss, metrics). Metrics are detached 0-d tensors named as in
docs/rl.md, "Metrics" (actor/clipfrac_lower_neg, actor/clipfrac_upper_pos, actor/clipfrac,
actor/ppo_kl, ...) and no value is read back to the host, so computing a loss never forces a
device sync.
"""

from __future__ import annotations

import inspect
import math

import torch

from fp8rl.utils import masked_mean

from ._shapes import as_bool_mask, broadcast_advantages, check_float, check_same_shape
from .aggregation import aggregate
from .clipping import clip_metrics, lower_clipped, masses_at, ratio, upper_clipped
from .registry import Metrics, get_policy_loss, register_policy_loss

_AGG_OPTIONS = ("norm_len", "global_token_count", "global_seq_count")


def policy_loss(
    name: str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    lower: float,
    upper: float,
    agg: str = "token-mean",
    tis_weights: torch.Tensor | None = None,
    **options,
):
    """The loss `name` aggregated with `agg`, times the (detached) TIS weights if given.

    log_prob, old_log_prob, mask: (B, T) (or flat (n,) with agg="token-mean");
    advantages: same shape or (B,). lower/upper: the clip bounds L < 1 < H.
    Aggregation options (see aggregation.aggregate): norm_len, global_token_count,
    global_seq_count. Any other keyword goes to the loss (e.g. dual_clip=3.0 for ppo_clip).
    """
    fn = get_policy_loss(name)
    check_same_shape(
        "log_prob", log_prob, old_log_prob=old_log_prob, mask=mask, tis_weights=tis_weights
    )
    lower = check_float("lower", lower, low=0.0, high=1.0, high_open=True)
    upper = check_float("upper", upper, low=1.0, low_open=True)
    agg_options = {k: options.pop(k) for k in _AGG_OPTIONS if k in options}
    valid = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        extra = sorted(set(valid) - {"lower", "upper"})
        raise ValueError(
            f"policy loss {name!r} got unknown option(s) {unknown}; "
            f"its options: {extra or 'none'}, aggregation options: {list(_AGG_OPTIONS)}"
        )

    m = as_bool_mask(mask)
    adv = broadcast_advantages(advantages, log_prob, "log_prob")
    # Padded positions may hold anything (even -inf): replace them so that neither the
    # loss nor its gradient can pick up a NaN from them.
    zero = torch.zeros_like(log_prob)
    lp = torch.where(m, log_prob, zero)
    old = torch.where(m, old_log_prob.detach().to(log_prob.dtype), zero)
    adv = torch.where(m, adv.detach(), zero)

    loss_mat, metrics = fn(lp, old, adv, m, lower=lower, upper=upper, **options)
    if tis_weights is not None:
        loss_mat = loss_mat * tis_weights.detach().to(loss_mat.dtype)
    loss = aggregate(loss_mat, m, agg, **agg_options)
    metrics["actor/pg_loss"] = loss.detach()
    return loss, metrics


def _clipped_surrogate(lp, old, adv, m, lower, upper, dual_clip):
    """-min(r A, clamp(r, L, H) A), written with explicit clip masks so that a clipped
    token's loss is the constant -bound * A (zero gradient, also at exact ties)."""
    r = ratio(lp, old)
    low = lower_clipped(r.detach(), adv, m, lower)
    up = upper_clipped(r.detach(), adv, m, upper)
    weight = torch.where(low, lower, torch.where(up, upper, r))
    loss = -adv * weight
    metrics = clip_metrics(r.detach(), adv, m, lower, upper, old, lp)
    if dual_clip is not None:
        # min(loss, -c A) for A < 0: binds exactly when r > c.
        dual = m & (adv < 0) & (r.detach() > dual_clip)
        loss = torch.where(dual, -dual_clip * adv, loss)
        metrics["actor/clipfrac_dual"] = masked_mean(dual.to(r.dtype), m).detach()
    return loss, metrics


def _check_dual(dual_clip):
    if dual_clip is None:
        return None
    return check_float(
        "dual_clip", dual_clip, low=1.0, high=math.inf, low_open=True, high_open=True
    )


@register_policy_loss("ppo_clip")
def ppo_clip(lp, old, adv, m, *, lower, upper, dual_clip=None) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip with bounds (lower, upper); dual_clip=c adds min(loss, -c A) for A < 0.

    The one clipped-surrogate loss: grpo, dapo, relax_lower and calibrated differ only in the
    bounds their bound source (rl/loss_modes.py) passes in."""
    return _clipped_surrogate(lp, old, adv, m, lower, upper, _check_dual(dual_clip))


@register_policy_loss("cispo")
def cispo(lp, old, adv, m, *, lower, upper) -> tuple[torch.Tensor, Metrics]:
    """CISPO: -sg(clamp(r, L, H)) A logp. Every token keeps a gradient (-w A); the
    actor/clipfrac_* metrics count the tokens PPO-clip would have clipped."""
    r = ratio(lp, old)
    w = r.detach().clamp(lower, upper)
    loss = -w * adv * lp
    metrics = clip_metrics(r.detach(), adv, m, lower, upper, old, lp)
    truncated = m & ((r.detach() < lower) | (r.detach() > upper))
    metrics["actor/cispo_truncfrac"] = masked_mean(truncated.to(r.dtype), m).detach()
    return loss, metrics


def _bapo_path(lower, upper, lower_max, upper_max, step):
    """Candidate bounds in search order: the lower bound first, step by step to
    lower_max, then (with the lower bound at its max) the upper bound to upper_max."""
    n_low = int(math.floor((lower_max - lower) / step + 1e-9))
    n_up = int(math.floor((upper_max - upper) / step + 1e-9))
    lows = [lower + k * step for k in range(n_low + 1)]
    ups = [upper] * len(lows)
    lows += [lows[-1]] * n_up
    ups += [upper + j * step for j in range(1, n_up + 1)]
    return lows, ups


@register_policy_loss("bapo")
def bapo(
    lp, old, adv, m, *, lower, upper, lower_max=0.9, upper_max=3.0, step=0.05, target=0.5
) -> tuple[torch.Tensor, Metrics]:
    """BAPO: per batch, pick PPO-clip bounds on the path lower..lower_max (upper fixed),
    then upper..upper_max, stopping at the first whose positive share of the
    gradient-carrying mass, pos(r; H) / (pos(r; H) + neg(r; L)), reaches `target`
    (the last candidate if none does). Pass lower=0.6, upper=1.2 for the paper's ranges.
    Reports the chosen bounds as actor/bapo_lower, actor/bapo_upper."""
    lower_max = check_float("lower_max", lower_max, low=lower, high=1.0, high_open=True)
    upper_max = check_float("upper_max", upper_max, low=upper, high=math.inf, high_open=True)
    step = check_float("step", step, low=0.0, low_open=True)
    target = check_float("target", target, low=0.0, high=1.0)
    lows, ups = _bapo_path(lower, upper, lower_max, upper_max, step)
    lows_t = torch.tensor(lows, dtype=lp.dtype, device=lp.device)
    ups_t = torch.tensor(ups, dtype=lp.dtype, device=lp.device)

    r = ratio(lp, old).detach()
    pos, neg = masses_at(r, adv, m, lows_t, ups_t)
    total = pos + neg
    share = torch.where(
        total > 0,
        pos / torch.where(total > 0, total, torch.ones_like(total)),
        torch.ones_like(total),
    )
    reached = share >= target
    # First candidate that reaches the target, without a host round trip.
    idx = torch.where(
        reached.any(),
        reached.to(torch.int8).argmax(),
        torch.tensor(len(lows) - 1, device=lp.device),
    )
    chosen_low, chosen_up = lows_t[idx], ups_t[idx]
    loss, metrics = _clipped_surrogate(lp, old, adv, m, chosen_low, chosen_up, None)
    metrics["actor/bapo_lower"] = chosen_low.detach()
    metrics["actor/bapo_upper"] = chosen_up.detach()
    metrics["actor/bapo_pos_share"] = share[idx].detach()
    return loss, metrics
