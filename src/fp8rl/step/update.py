"""The update phase of a step: one optimizer update per mini-batch (docs/architecture.md,
"Reading one step").

    per mini-batch: [shadow pass 2: BF16 log-probs of its rows] -> forward_backward (the loss
    of each micro-batch, gradients accumulated) -> apply_update (one read-back, the optimizer
    step or a skip)

`update_policy` runs them for a step and returns its shadow rows (at shadow steps), the mean
metrics and the skipped updates. A single update reads only the `UpdateContext` (the model,
its optimizer, the plan and the step's clip bounds), so it can be called on its own
(`bench/e2e/train.py`). Inside the loop values stay on the device: one transfer per mini-batch
brings back the skip decision and the metrics together (tests/test_step_host_syncs.py holds
the budget); a non-finite loss or gradient skips the update, and the words below say where
it began.
"""

from __future__ import annotations

import torch

from ..fp8 import high_precision, record_nonfinite, use_recipe
from ..rl.losses import policy_loss
from ..rl.shadow import ShadowRows
from ..rollout import RolloutBatch, compute_log_probs
from ..utils import host_list
from .ablations import UpdateHook
from .context import StepContext, UpdateContext
from .records import Gradients, MiniBatch, StepData, UpdateOutput, shadow_rows


def minibatches(ctx: StepContext, mask: torch.Tensor, step: int) -> list[MiniBatch]:
    """The step's mini-batches: the global batch (all ranks' rows in rank order) is shuffled
    and split, and each rank keeps its own rows of every part. `mask`: the (B, T) response
    mask of this rank's rows."""
    size = mask.shape[0]
    offset, total = ctx.dp.row_offset(size)
    perm = torch.randperm(total, generator=ctx.seeds.generator(step, "shuffle"))
    # a part may hold none of this rank's rows: the rank still joins that update's collectives
    parts = [
        ([i - offset for i in host_list(chunk) if offset <= i < offset + size], len(chunk))
        for chunk in perm.chunk(ctx.plan.mini_batches)
        if chunk.numel() > 0
    ]
    # every update's token normalizer in one reduction (on the device: no read-back)
    tokens = ctx.dp.sum(torch.stack([mask[rows].float().sum() for rows, _ in parts]))
    tokens = tokens.clamp_min(1)
    return [MiniBatch(rows, n, tokens[k]) for k, (rows, n) in enumerate(parts)]


def update_policy(
    ctx: StepContext,
    data: StepData,
    step: int,
    shadow: bool,
    bounds: tuple[float, float],
    spare: RolloutBatch | None = None,
) -> tuple[ShadowRows | None, dict, int]:
    """One optimizer update per mini-batch at the clip `bounds` (at shadow steps shadow pass 2
    before each). Returns the updates' shadow rows (shadow steps; this rank's), the mean
    metrics and the number of skipped updates."""
    plan, uctx = ctx.plan, update_context(ctx, bounds)
    hook, micro, temperature = plan.hook, plan.logprob_micro_batch_size, plan.temperature
    index, log_probs, log_probs_shadow, clean = [], [], [], []
    sums: dict[str, float] = {}
    n_updates = skipped = 0
    for k, mb in enumerate(minibatches(ctx, data.batch.response_mask, step)):
        idx = torch.tensor(mb.rows, dtype=torch.long, device=ctx.device)
        ctx.dp.unshard(ctx.model)
        log_prob_shadow = None
        if shadow and hook.bf16_passes:  # forward-only, the weights of this update's
            selected = data.batch.select(mb.rows)
            with torch.no_grad(), high_precision(ctx.model):
                log_prob_shadow = batch_log_probs(ctx.model, selected, temperature, micro)
        update_hook = hook.update(ctx.seeds, data, idx, k, step, log_prob_shadow)
        out = update_minibatch(uctx, data, mb, spare, update_hook)
        if shadow:
            log_probs_shadow.append(update_hook.shadow(out.clean_log_prob))
        index.append(idx)
        log_probs.append(out.log_prob)
        clean.append(out.clean_log_prob)
        for name, v in out.metrics.items():
            sums[name] = sums.get(name, 0.0) + v
        n_updates += 1
        skipped += int(out.skipped)
    if data.fold is not None:  # a folded step: the old log-probs from this update's
        data.fold.fill(data, torch.cat(index), torch.cat(clean))
    metrics = {k: v / max(n_updates, 1) for k, v in sums.items()}
    metrics["train/skipped_updates"] = float(skipped)
    metrics["train/updates"] = float(n_updates)
    rows = None
    if shadow:
        rows = shadow_rows(
            data, torch.cat(index), torch.cat(log_probs), torch.cat(log_probs_shadow)
        )
    return rows, metrics, skipped


def update_context(ctx: StepContext, bounds: tuple[float, float]) -> UpdateContext:
    """What this step's updates read, at the clip `bounds` in use (calibration moves them only
    after the updates)."""
    return UpdateContext.from_plan(
        ctx.plan,
        bounds,
        model=ctx.model,
        optimizer=ctx.optimizer,
        train_recipe=ctx.train_recipe,
        dp=ctx.dp,
        device=ctx.device,
        log_event=ctx.log_event,
    )


def micro_slices(n: int, micro: int) -> list[slice]:
    step = micro if micro > 0 else max(n, 1)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


_PLAIN = UpdateHook()  # a production update: the log-probs as the model gives them


def update_minibatch(
    uctx: UpdateContext,
    data: StepData,
    mb: MiniBatch,
    spare: RolloutBatch | None = None,
    hook: UpdateHook = _PLAIN,
) -> UpdateOutput:
    """One optimizer update on the mini-batch `mb`: the gradients, then the step (or a skip).
    `hook`: what an ablation changes of the log-probs the loss sees (ablations.py)."""
    return apply_update(uctx, forward_backward(uctx, data, mb, spare, hook))


def forward_backward(
    uctx: UpdateContext, data: StepData, mb: MiniBatch, spare, hook: UpdateHook
) -> Gradients:
    """Gradient accumulation over micro-batches, weighted so the sum equals the mini-batch loss
    (and, under data parallel, so the ranks' gradients add up to the global batch's)."""
    model, dp, plan = uctx.model, uctx.dp, uctx.plan
    batch = data.batch.select(mb.rows)
    idx = torch.tensor(mb.rows, dtype=torch.long, device=uctx.device)
    adv, fold = data.advantages[idx], data.fold
    old = data.old_log_probs[idx] if fold is None else None
    tis = data.tis[idx] if data.tis is not None else None
    mask = batch.response_mask
    uctx.optimizer.zero_grad(set_to_none=True)
    log_probs, clean, weighted = [batch.log_probs[:0]], [batch.log_probs[:0]], {}
    total_loss = torch.zeros((), device=uctx.device)
    slices = micro_slices(mask.shape[0], plan.micro_batch_size)
    # Non-finite FP8 inputs are recorded, not raised: the nan they leave in the loss or the
    # gradients skips the update on every rank, where an exception on one rank would
    # leave the others waiting in the gradient all-reduce.
    with use_recipe(model, uctx.train_recipe), record_nonfinite() as nonfinite:
        for i, sl in enumerate(slices):
            sub = batch.select(range(sl.start, sl.stop))
            lp, _ = compute_log_probs(model, sub, temperature=plan.temperature)
            clean.append(lp.detach())
            if fold is None:
                old_sl, tis_sl = old[sl], None if tis is None else tis[sl]
            else:  # the old policy is this one: ratio exactly 1
                old_sl, tis_sl = fold.micro(clean[-1], sub)
            lp, loss_name, options = hook.loss_inputs(lp, sl, plan.mode.loss, plan.loss_options)
            loss, metrics = policy_loss(
                loss_name,
                lp,
                old_sl,
                adv[sl],
                mask[sl],
                lower=uctx.lower,
                upper=uctx.upper,
                agg=plan.agg,
                tis_weights=tis_sl,
                **options,
            )
            w, mw = micro_weights(uctx, mb, mask[sl], sl)
            dp.backward(model, loss * w, last=i == len(slices) - 1)
            total_loss = total_loss + loss.detach() * w
            log_probs.append(lp.detach())
            for k, v in metrics.items():
                weighted[k] = weighted.get(k, 0.0) + v.detach() * (
                    w if k == "actor/pg_loss" else mw
                )
        dp.finish_backward(model, had_backward=bool(slices), zero_loss=_zero_loss(uctx, spare))
    return Gradients(total_loss, weighted, torch.cat(log_probs, 0), torch.cat(clean, 0), nonfinite)


def micro_weights(uctx: UpdateContext, mb: MiniBatch, mask, sl: slice):
    """(loss weight, metric weight) of a micro-batch: shares of the global mini-batch, so the
    weighted sums over micro-batches (and ranks) are the mini-batch's loss and metrics."""
    tokens = mask.float().sum() / mb.total_tokens
    if uctx.plan.agg == "token-mean":  # pools tokens
        return tokens, tokens
    # the seq-mean family and the constant normalizer pool rows; the metrics are token means
    return torch.tensor((sl.stop - sl.start) / mb.total_rows, device=uctx.device), tokens


_LOSS = "__loss"  # the loss's key beside the metrics in the one sum of the update


def apply_update(uctx: UpdateContext, grads: Gradients) -> UpdateOutput:
    """The mini-batch's one read-back (the skip decision and every metric together), then the
    optimizer step; a non-finite loss or gradient skips it, leaving weights and moments alone."""
    model, dp = uctx.model, uctx.dp
    sums = dp.sum_dict({_LOSS: grads.loss, **grads.metrics})  # the global mini-batch's
    total_loss = sums.pop(_LOSS)
    # before clipping, which spreads one nan over every gradient; kept on the device (no sync)
    grad_flags = grad_finite_flags(model) if uctx.plan.check_finite else None
    grad_norm = dp.clip_gradients(model, uctx.plan.max_grad_norm)
    # the summed loss and the norm of the summed gradients are global: all ranks step or skip
    bad = ~(torch.isfinite(total_loss) & torch.isfinite(grad_norm))
    names = list(sums)
    values = torch.stack(
        [x.double() for x in (bad, total_loss, grad_norm, *(sums[k] for k in names))]
    ).tolist()
    ok = values[0] == 0
    if ok:
        dp.optimizer_step(model, uctx.optimizer)
    else:  # never let a NaN/Inf reach the weights or the optimizer moments
        where = locate(grads.nonfinite, grad_flags)
        uctx.optimizer.zero_grad(set_to_none=True)
        uctx.log_event(
            f"non-finite loss {values[1]} or grad norm {values[2]}: update skipped; {where}"
        )
    out = dict(zip(names, values[3:], strict=True))
    out.update({"actor/loss": values[1], "actor/grad_norm": values[2]})
    return UpdateOutput(grads.log_prob, out, skipped=not ok, clean_log_prob=grads.clean_log_prob)


def _zero_loss(uctx: UpdateContext, spare: RolloutBatch | None):
    """A zero loss through the model, for a rank that must join a collective backward with
    no rows of its own in the mini-batch (FSDP2's reduce-scatter)."""

    def loss() -> torch.Tensor:
        with use_recipe(uctx.model, uctx.train_recipe):
            lp, _ = compute_log_probs(uctx.model, spare, temperature=uctx.plan.temperature)
        return lp.sum() * 0.0

    return loss


def batch_log_probs(model, batch, temperature, micro, with_entropy: bool = False):
    """The log-probs (B, T); with `with_entropy`, (log-probs, entropy) of the same forward."""
    if len(batch) == 0:  # a data-parallel rank whose groups were all filtered out
        empty = batch.log_probs.clone()
        return (empty, torch.zeros_like(empty)) if with_entropy else empty
    lp, entropy = compute_log_probs(
        model, batch, temperature=temperature, micro_batch_size=micro, with_entropy=with_entropy
    )
    return (lp, entropy) if with_entropy else lp


# ------------------------------------------------------------------ non-finite values


def causes(names: list[str], most: int = 3) -> str:
    shown = ", ".join(dict.fromkeys(names[:most]))
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def grad_finite_flags(model) -> list[tuple[str, torch.Tensor]]:
    flags = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None:
            g = g.to_local() if hasattr(g, "to_local") else g  # an FSDP shard: this rank's part
            flags.append((name, torch.isfinite(g).all()))
    return flags


def locate(nonfinite: list[str], grad_flags) -> str:
    """Where the non-finite values began, as far as train.fp8_check_finite lets us know."""
    if grad_flags is None:
        return "cause not located (train.fp8_check_finite is off)"
    parts = []
    if nonfinite:
        parts.append(f"non-finite FP8 inputs: {causes(nonfinite)}")
    bad = [name for name, ok in grad_flags if not bool(ok)]
    if bad:
        parts.append(f"non-finite gradients of {causes(bad)}")
    return "; ".join(parts) or "no non-finite FP8 input or gradient on this rank"
