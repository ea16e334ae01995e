"""One RL step, read top to bottom (docs/architecture.md, "Reading one step").

    rollout (rollout recipe) -> rewards -> advantages (+ DAPO filter, overlong shaping)
    -> old log-probs (training recipe, no grad)  [+ shadow pass 1: BF16 old log-probs]
    -> per mini-batch (update.py): forward_backward, apply_update  [+ shadow pass 2 before each]
    -> shadow diagnostics and, for `calibrated`, the pool and (at refit steps) the next bounds.

Every phase takes the `StepContext` (an update the narrower `UpdateContext`) and returns what
it produces; what a run decided once, it reads from `ctx.plan` (context.py). The clip bounds
are resolved once, at the start of the step, and both the updates and the shadow phase get
them. The two ablations change log-probs only through the plan's hook (ablations.py), which
changes nothing in a production run. `ctx.dp` is the data-parallel seam: on one process
every reduction is the identity, and the per-rank metrics are reduced once, at the end.
The updates (update.py) keep values on the device: one transfer per mini-batch brings back
the skip decision and the metrics together (tests/test_step_host_syncs.py holds the budget).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..fp8 import high_precision, record_nonfinite, use_recipe
from ..rl.losses import dynamic_sampling_mask, grpo_advantages, overlong_penalty
from ..rl.shadow import response_stats, shadow_phase
from ..rl.tis import k3_kl, tis_weights, token_prob_error
from ..rollout import RolloutBatch
from ..tasks import prompt_inputs, score_batch
from ..utils import host_list, masked_mean
from .context import StepContext
from .fold import folded_data
from .records import StepData, StepResult, Timer, sample_rows
from .update import batch_log_probs, causes, update_policy

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
    for kind in ctx.task.garble_kinds:  # what the garbling is, beside how often
        shows = [kind in r.info.get("malformations", ()) for r in scored.results]
        metrics[f"rollout/malformed_frac/{kind}"] = sum(shows) / max(len(shows), 1)
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
        _, entropy = batch_log_probs(ctx.model, batch, temperature, micro, with_entropy=True)
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
                old, entropy = batch_log_probs(
                    ctx.model, batch, temperature, micro, with_entropy=True
                )
                batch = replace(batch, entropy=entropy)
            else:
                old = batch_log_probs(ctx.model, batch, temperature, micro)
        if nonfinite:  # the nan old log-probs make this step's updates skip; say where it began
            ctx.log_event(f"non-finite FP8 input in the old log-probs pass: {causes(nonfinite)}")
        old, old_log_prob_shadow, hook_state = plan.hook.old(
            ctx.seeds, old, batch.response_mask, step
        )
        if shadow and plan.hook.bf16_passes:  # the same weights with quantization switched off
            with high_precision(ctx.model):
                old_log_prob_shadow = batch_log_probs(ctx.model, batch, temperature, micro)
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


__all__ = ["StepData", "StepResult", "run_step"]
