"""One RL step, read top to bottom (docs/architecture.md, "Reading one step").

    rollout (rollout recipe) -> rewards -> advantages (+ DAPO filter, overlong shaping)
    -> old log-probs (training recipe, no grad)  [+ shadow pass 1: BF16 old log-probs]
    -> per mini-batch: forward_backward, apply_update  [+ shadow pass 2 before each]
    -> shadow diagnostics and, for `calibrated`, the pool and (at refit steps) the next bounds.

Every phase takes the `StepContext` (an update the narrower `UpdateContext`) and returns what
it produces; what a run decided once, it reads from `ctx.plan` (context.py). The clip bounds
are resolved once, at the start of the step, and both the updates and the shadow phase get
them. The two ablations change log-probs only through the plan's hook (ablations.py), which
changes nothing in a production run. `ctx.dp` is the data-parallel seam: on one process
every reduction is the identity, and the per-rank metrics are reduced once, at the end.
Inside the mini-batch loop values stay on the device: one transfer per mini-batch brings back
the skip decision and the metrics together (tests/test_step_host_syncs.py holds the budget).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..fp8 import high_precision, record_nonfinite, use_recipe
from ..rl.losses import dynamic_sampling_mask, grpo_advantages, overlong_penalty, policy_loss
from ..rl.shadow import ShadowRows, response_stats, shadow_phase
from ..rl.tis import k3_kl, tis_weights, token_prob_error
from ..rollout import RolloutBatch, compute_log_probs
from ..tasks import prompt_inputs, score_batch
from ..utils import host_list, masked_mean
from .ablations import UpdateHook
from .context import StepContext, UpdateContext
from .fold import folded_data
from .records import (
    Gradients,
    MiniBatch,
    StepData,
    StepResult,
    UpdateOutput,
    sample_rows,
    shadow_rows,
)
from .support import Timer, causes, grad_finite_flags, locate

MAX_KEYS = ("actor/tis_raw_weight_max",)  # per-rank metrics reduced as a max, not a mean


def run_step(ctx: StepContext, step: int) -> StepResult:
    """One RL step on this process's share of the step's prompts, the phases in order.

    Returns the step's metrics (global means under data parallel), how many updates were
    skipped, and at shadow steps the rows the shadow phase read (with log.response_stats the
    per-response rows too)."""
    timer, dp = Timer(), ctx.dp
    bounds_in_use = bounds_metrics(ctx)  # calibration below sets the next step's
    bounds = ctx.calibration.clip_bounds  # the loss's, this whole step
    # -------- rollout, rewards, advantages
    samples = ctx.prompts.for_step(step)
    lo, hi = dp.share(len(samples))  # data parallel: this rank's contiguous share of the groups
    samples = samples[lo:hi]
    sync_if_due = getattr(ctx.engine, "sync_if_due", None)  # an engine holding its own weights
    if sync_if_due is not None:
        with timer("weight_sync"):
            sync_if_due(step)
    with timer("rollout"):
        dp.unshard(ctx.model)  # FSDP2: the weights stay gathered through the old log-probs
        batch = dp.pad_responses(rollout(ctx, samples, step))
    with timer("reward"):
        rewards, local = score(ctx, batch, samples)
    logged = logged_samples(ctx, batch, samples, rewards, step)
    advantages, keep, adv_metrics = advantages_for(ctx, rewards, batch)
    local.update(adv_metrics)
    local.update(rollout_metrics(batch))
    # this rank's means and their weights (rows or tokens), reduced at the end of the step
    weights = {
        k: (batch.response_mask.sum() if k == "rollout/entropy" else len(batch)) for k in local
    }
    kept = [i for i, k in enumerate(host_list(keep)) if k]
    if dp.sum_int(len(kept)) == 0:
        if batch.entropy is None:  # no old-log-prob pass to take it from: one forward for it
            local["rollout/entropy"], weights["rollout/entropy"] = trainer_entropy(ctx, batch)
        metrics = {"train/skipped_empty_batch": 1.0}
        row = step_metrics(ctx, local, weights, metrics, timer, bounds_in_use)
        return StepResult(row, samples=logged)
    spare = batch.select([0])  # a row for lock-step dummy passes when a rank keeps none
    batch = batch.select(kept)
    advantages = advantages[torch.tensor(kept, dtype=torch.long, device=advantages.device)]
    # -------- old log-probs (and the BF16 shadow's, at shadow steps)
    shadow = ctx.calibration.is_shadow_step(step)
    fold = ctx.plan.folds(batch, shadow)  # train.fold_old_log_probs: the update makes them
    with timer("old_log_probs"):
        if fold:
            data = folded_data(ctx.plan, batch, advantages)
        else:
            data = prepare_update(ctx, batch, advantages, shadow, step)
    if batch.entropy is None:  # the engine left the entropy to the old-log-prob pass (vLLM)
        mask = data.batch.response_mask
        local["rollout/entropy"] = masked_mean(data.batch.entropy, mask.float())
        weights["rollout/entropy"] = mask.sum()
    if not fold:
        add_mismatch(local, weights, data)
    # -------- one optimizer update per mini-batch
    with timer("update"):
        rows, metrics, skipped = update_policy(ctx, data, step, shadow, bounds, spare)
    if fold:  # the old log-probs exist now
        add_mismatch(local, weights, data)
    if ctx.plan.fold_old_log_probs:
        metrics["train/old_log_probs_folded"] = float(fold)
    # -------- the shadow phase: diagnostics, and for `calibrated` the next bounds
    responses = None
    if rows is not None:
        with timer("calibrate"):
            rows = rows.gathered(dp)  # the record, handed over whole to rl/shadow.py
            metrics.update(shadow_phase(rows, state=ctx.calibration, step=step, bounds=bounds))
            if ctx.plan.response_stats and dp.is_main:
                responses = response_stats(rows, bounds[0], step)
    metrics["train/shadow_step"] = float(shadow)
    row = step_metrics(ctx, local, weights, metrics, timer, bounds_in_use)
    return StepResult(row, skipped, responses, rows, samples=logged)


def logged_samples(ctx: StepContext, batch, samples, rewards, step: int) -> list[dict] | None:
    """log.samples: a few of rank 0's responses with their prompts and rewards."""
    if not ctx.plan.samples or not ctx.dp.is_main:
        return None
    prompts = [samples[i] for i in batch.prompt_index.tolist()]
    return sample_rows(step, batch.texts, prompts, host_list(rewards), ctx.plan.samples)


def bounds_metrics(ctx: StepContext) -> dict:
    return {"calib/lower": ctx.calibration.lower, "calib/upper": ctx.calibration.upper}


def step_metrics(ctx: StepContext, local, weights, metrics, timer, bounds_in_use) -> dict:
    """The step's row: this rank's means reduced to the global batch's (the one reduction of
    the step's metrics), then the metrics that are global already (updates, shadow)."""
    reduced = ctx.dp.mean_metrics(local, weights, max_keys=MAX_KEYS)
    return {**reduced, **metrics, **timer.metrics(), **bounds_in_use}


# ------------------------------------------------------------------ rollout and rewards


def rollout(ctx: StepContext, samples, step: int) -> RolloutBatch:
    """`rollout.n` responses per prompt from the rollout engine (the rollout recipe)."""
    params = ctx.plan.sampling
    prompts = prompt_inputs(samples)
    # one generate per rollout shard, each with its own generator (see Seeds.rollout_parts)
    batches = [
        ctx.engine.generate(prompts[lo:hi], params, generator=ctx.seeds.generator(step, key))
        for key, lo, hi in ctx.seeds.rollout_parts(len(prompts))
    ]
    return batches[0] if len(batches) == 1 else RolloutBatch.concat(batches)


def score(ctx: StepContext, batch: RolloutBatch, samples) -> tuple[torch.Tensor, dict]:
    """All responses in one `task.rewards` call, so a task can grade them in parallel."""
    scored = score_batch(ctx.task, batch.texts, [samples[i] for i in batch.prompt_index.tolist()])
    rewards = torch.tensor(scored.scores, dtype=torch.float32)
    parsed, malformed = scored.parsed, scored.malformed
    metrics = {
        "rollout/reward": rewards.mean(),
        "rollout/parsed_frac": sum(parsed) / max(len(parsed), 1),
        "rollout/malformed_frac": sum(malformed) / max(len(malformed), 1),
    }
    return rewards, metrics


def advantages_for(
    ctx: StepContext, rewards: torch.Tensor, batch
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Group-normalised advantages of the (overlong-shaped) rewards, and the rows to keep."""
    plan = ctx.plan
    n, shaped = plan.sampling.n, rewards
    if plan.overlong_buffer > 0:
        lengths = batch.response_lengths.float().cpu()
        shaped = rewards + overlong_penalty(
            lengths, plan.sampling.max_new_tokens, plan.overlong_buffer, plan.overlong_factor
        )
    adv = grpo_advantages(shaped, n, std_normalize=plan.std_normalize)
    keep = (
        dynamic_sampling_mask(shaped, n)
        if plan.dynamic_sampling
        else torch.ones_like(shaped, dtype=torch.bool)
    )
    metrics = {"rollout/shaped_reward": shaped.mean(), "train/kept_frac": keep.float().mean()}
    # keep stays on the host (rewards are host values): the row selection reads nothing back
    return adv.to(ctx.device), keep, metrics


def rollout_metrics(batch) -> dict:
    """This rank's means of the rollout: entropy per token (when the engine computed it; else
    the old-log-prob pass gives it), length and truncation per row."""
    mask = batch.response_mask.float()
    out = {}
    if batch.entropy is not None:
        out["rollout/entropy"] = masked_mean(batch.entropy.float(), mask)
    out["rollout/response_len"] = batch.response_lengths.float().mean()
    out["rollout/truncated_frac"] = batch.truncated.float().mean()
    return out


def trainer_entropy(ctx: StepContext, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean token entropy, tokens) of a batch whose engine left the entropy out, from a
    forward of the trainer (training recipe, full softmax at the rollout's temperature)."""
    micro, temperature = ctx.plan.logprob_micro_batch_size, ctx.plan.temperature
    with torch.no_grad(), use_recipe(ctx.model, ctx.train_recipe):
        _, entropy = _log_probs(ctx.model, batch, temperature, micro, with_entropy=True)
    mask = batch.response_mask
    return masked_mean(entropy, mask.float()), mask.sum()


# ------------------------------------------------------------------ old log-probs and TIS


def prepare_update(ctx: StepContext, batch, advantages, shadow: bool, step: int = 0) -> StepData:
    """The old log-probs (training recipe, no grad), at shadow steps their BF16 shadow (pass 1),
    and the TIS weights: what every update of the step reads."""
    plan = ctx.plan
    micro, temperature = plan.logprob_micro_batch_size, plan.temperature
    need_entropy = batch.entropy is None  # the engine left it to this pass (vLLM)
    with torch.no_grad():
        with use_recipe(ctx.model, ctx.train_recipe), record_nonfinite() as nonfinite:
            if need_entropy:
                old, entropy = _log_probs(ctx.model, batch, temperature, micro, with_entropy=True)
                batch = replace(batch, entropy=entropy)
            else:
                old = _log_probs(ctx.model, batch, temperature, micro)
        if nonfinite:  # the nan old log-probs make this step's updates skip; say where it began
            ctx.log_event(f"non-finite FP8 input in the old log-probs pass: {causes(nonfinite)}")
        old, old_log_prob_shadow, hook_state = plan.hook.old(
            ctx.seeds, old, batch.response_mask, step
        )
        if shadow and plan.hook.bf16_passes:  # the same weights with quantization switched off
            with high_precision(ctx.model):
                old_log_prob_shadow = _log_probs(ctx.model, batch, temperature, micro)
    tis, metrics = None, {}
    if plan.tis:
        tis, metrics = tis_weights(
            old,
            batch.comparable_log_probs,  # full softmax: truncation is no precision error
            batch.response_mask,
            level=plan.tis_level,
            mode=plan.tis_mode,
            cap=plan.tis_cap,
        )
    return StepData(batch, advantages, old, old_log_prob_shadow, tis, metrics, hook_state)


def _log_probs(model, batch, temperature, micro, with_entropy: bool = False):
    """The log-probs (B, T); with `with_entropy`, (log-probs, entropy) of the same forward."""
    if len(batch) == 0:  # a data-parallel rank whose groups were all filtered out
        empty = batch.log_probs.clone()
        return (empty, torch.zeros_like(empty)) if with_entropy else empty
    lp, entropy = compute_log_probs(
        model, batch, temperature=temperature, micro_batch_size=micro, with_entropy=with_entropy
    )
    return (lp, entropy) if with_entropy else lp


def add_mismatch(local: dict, weights: dict, data: StepData) -> None:
    """The mismatch metrics into this rank's means, each weighted by the response tokens."""
    mismatch = mismatch_metrics(data)
    local.update(mismatch)
    weights.update(dict.fromkeys(mismatch, data.batch.response_mask.sum()))


def mismatch_metrics(data: StepData) -> dict:
    """The rollout/trainer mismatch: TIS's metrics, the KL of the two log-probs and the token
    probability error, both sides' log-probs of the full softmax (docs/rollout.md)."""
    out = dict(data.metrics)
    rollout_lp, mask = data.batch.comparable_log_probs, data.batch.response_mask
    out["mismatch/kl_rollout_train"] = k3_kl(rollout_lp, data.old_log_probs, mask)
    out["mismatch/token_prob_error"] = token_prob_error(rollout_lp, data.old_log_probs, mask)
    return out


# ------------------------------------------------------------------ mini-batch updates


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
                log_prob_shadow = _log_probs(ctx.model, selected, temperature, micro)
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


__all__ = [
    "run_step",
    "MiniBatch",
    "StepData",
    "StepResult",
    "UpdateOutput",
    "update_context",
    "update_minibatch",
]
