"""What the rewards become and the policy losses, one catalogue (docs/rl.md, "Advantages" and
"Policy losses"), as verl's core_algos keeps them: the advantages and reward shaping (GRPO,
Dr. GRPO, DAPO dynamic sampling and overlong penalty; rewards are one per sample, the
`group_size` samples of a prompt consecutive), then the loss registry, `policy_loss`, which
checks, neutralises and aggregates for every registered loss, and the built-in losses
ppo_clip, cispo, bapo, gspo and oracle_clip, registered by name at the end of this module.

Every loss returns (scalar loss, metrics). Metrics are detached 0-d tensors named as in
docs/rl.md, "Metrics" (actor/clipfrac_lower_neg, actor/clipfrac_upper_pos, actor/clipfrac,
actor/ppo_kl, ...) and no value is read back to the host, so computing a loss never forces a
device sync.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from fp8rl.utils import masked_mean

from ._shapes import (
    as_bool_mask,
    broadcast_advantages,
    check_float,
    check_same_shape,
    check_tensor,
    require_2d,
)
from .clipping import (
    SEQ_LOG_RATIO_MAX,
    aggregate,
    clip_metrics,
    lower_clipped,
    masses_at,
    ratio,
    sequence_log_ratio,
    upper_clipped,
)

# ---------------------------------------------------------------- advantages
# grpo: (r - mean) / std within a group; drgrpo: r - mean (Dr. GRPO drops the std)
ADVANTAGE_KINDS = ("grpo", "drgrpo")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    check_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards has {rewards.shape[0]} entries, not a multiple of group_size={group_size}"
        )
    return rewards.view(-1, group_size)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """(r - group mean) / (group std + eps), one advantage per sample, shape (B,).

    std is the unbiased (n - 1) group std, as torch.std; a group of one sample has advantage 0.
    std_normalize=False is Dr. GRPO: r - group mean, no division.
    """
    eps = check_float("eps", eps, low=0.0)
    g = _groups(rewards, group_size)
    if not g.is_floating_point():
        g = g.to(torch.get_default_dtype())
    centred = g - g.mean(dim=1, keepdim=True)
    if std_normalize:
        std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling: False for every sample of a group whose rewards are all equal
    (such a group has zero advantage everywhere and only dilutes the batch)."""
    g = _groups(rewards, group_size)
    varied = g.amax(dim=1) != g.amin(dim=1)
    return varied.repeat_interleave(group_size)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment: min(-(len - (max_len - buffer)) / buffer * factor, 0).

    Zero up to max_len - buffer, then a linear ramp reaching -factor at max_len
    (not clamped beyond max_len, as the paper's formula).
    """
    check_tensor("lengths", lengths)
    max_len = check_float("max_len", max_len, low=0.0, low_open=True)
    buffer = check_float("buffer", buffer, low=0.0, high=max_len, low_open=True)
    factor = check_float("factor", factor, low=0.0)
    lengths = lengths.to(torch.get_default_dtype()) if not lengths.is_floating_point() else lengths
    penalty = -(lengths - (max_len - buffer)) / buffer * factor
    return penalty.clamp(max=0.0)


# ---------------------------------------------------------------- the registry
Metrics = dict[str, torch.Tensor]
Bound = float | torch.Tensor  # a 0-d tensor where the loss picks its bounds on the device (bapo)


class PolicyLossFn(Protocol):
    """A registered loss. It gets validated inputs of one shape (padded positions already
    neutralised, mask bool, advantages broadcast to the token shape, old log-probs detached)
    and returns the per-token loss and its metrics (detached 0-d tensors, docs/rl.md
    "Metrics"). Its keyword-only parameters other than lower/upper are its options."""

    def __call__(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        /,
        *,
        lower: Bound,
        upper: Bound,
        **options: Any,
    ) -> tuple[torch.Tensor, Metrics]: ...


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register fn(log_prob, old_log_prob, advantages, mask, *, lower, upper,
    **options) -> (per-token loss, metrics) under `name`."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLossFn:
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]


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
    Aggregation options (see clipping.aggregate): norm_len, global_token_count,
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


# ---------------------------------------------------------------- the built-in losses
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


def ppo_clip(lp, old, adv, m, *, lower, upper, dual_clip=None) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip with bounds (lower, upper); dual_clip=c adds min(loss, -c A) for A < 0.

    The one clipped-surrogate loss: grpo, dapo, relax_lower and calibrated differ only in the
    bounds their bound source (rl/loss_modes.py) passes in."""
    return _clipped_surrogate(lp, old, adv, m, lower, upper, _check_dual(dual_clip))


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


def gspo(lp, old, adv, m, *, lower, upper) -> tuple[torch.Tensor, Metrics]:
    """GSPO: PPO-clip on the sequence ratio at bounds (lower, upper) (GSPO's own: 1 - 3e-4,
    1 + 4e-4). Per response i, s_i = exp(min(mean_t log r_it, 10)) (clipping.sequence_ratio),
    and per token

        w_it = sg(s_i) * r_it / sg(r_it)        (the value s_i, the gradient s_i d log p_it)
        A < 0 and s_i < L:  -L A   (a constant: no gradient)
        A > 0 and s_i > H:  -H A   (a constant: no gradient)
        otherwise:          -A w_it

    so a clipped response loses the gradient of all its tokens together. The clamp at 10
    applies to the token's log w_it, as in verl's `compute_policy_loss_gspo`, which this
    equals in value and gradient (tests/test_integrations_verl.py). Needs (B, T) rows. The
    actor/clipfrac_* metrics count the tokens of clipped responses."""
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


def oracle_clip(
    lp, old, adv, m, *, lower, upper, log_prob_shadow=None, old_log_prob_shadow=None
) -> tuple[torch.Tensor, Metrics]:
    """Oracle clipping, the clip decision of the BF16 shadow and the gradient of FP8: PPO-clip
    whose clip masks come from the shadow ratio rhat = exp(log_prob_shadow -
    old_log_prob_shadow), both detached. Per token, with r the FP8 ratio:

        A < 0 and rhat < L:  -L A   (a constant: no gradient)
        A > 0 and rhat > H:  -H A   (a constant: no gradient)
        otherwise:           -A r   (gradient through the FP8 log-prob)

    Its FP8-vs-BF16 clip excess is 0 by construction; what is left of FP8's effect on
    training is the noise in the surrogate's gradient: if a run with it behaves like BF16,
    over-clipping is the channel through which FP8 noise acts. With rhat == r it is PPO-clip
    without dual clip, value and gradient. actor/clipfrac_* report the clips applied (the
    shadow's); actor/oracle_fp8_clipfrac what the FP8 ratio would have clipped and
    actor/oracle_flip_frac the share of tokens on which the two decisions differ.

        policy_loss("oracle_clip", log_prob, old_log_prob, advantages, mask, lower=L, upper=H,
                    log_prob_shadow=lp_bf16, old_log_prob_shadow=old_bf16)"""
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


# The built-in losses by name, registered here and nowhere else; a loss of one's own joins
# through register_policy_loss. (The order is the one they have always registered in.)
POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "gspo": gspo,
    "oracle_clip": oracle_clip,
    "ppo_clip": ppo_clip,
    "cispo": cispo,
    "bapo": bapo,
}
