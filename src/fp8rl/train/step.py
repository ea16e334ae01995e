"""One RL step, as docs/training.md lays it out, composed of small functions.

    rollout (rollout recipe) -> rewards -> advantages (+ DAPO filter, overlong shaping)
    -> old log-probs (training recipe, no grad)  [+ shadow pass 1: BF16 old log-probs]
    -> mini-batch updates                        [+ shadow pass 2 before each update]
    -> shadow diagnostics and, for `calibrated`, the pool and (at refit steps) the next bounds.

Every phase takes the `StepContext` and returns what it produces. Inside the mini-batch
loop values stay on the device: one transfer per mini-batch brings back the skip decision
and the metrics together (tests/test_train_host_syncs.py holds the budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fp8 import high_precision, record_nonfinite, use_recipe
from ..rl.advantages import dynamic_sampling_mask, grpo_advantages, overlong_penalty
from ..rl.diagnostics import k3_kl
from ..rl.losses import policy_loss
from ..rl.noise import correlated_errors
from ..rl.tis import tis_weights
from ..rollout import RolloutBatch, SamplingParams, compute_log_probs
from ..tasks import score_batch
from ..utils import host_list, masked_mean
from .context import StepContext
from .shadow import shadow_and_calibrate
from .step_support import Timer, causes, grad_finite_flags, locate


@dataclass
class StepResult:
    metrics: dict
    skipped_updates: int = 0  # mini-batch updates skipped for a non-finite loss or gradient
    responses: list[dict] | None = None  # log.response_stats, at shadow steps


@dataclass
class StepData:
    """The batch of one step after filtering, with everything the updates need."""

    batch: RolloutBatch
    advantages: torch.Tensor  # (B,)
    old_log_probs: torch.Tensor  # (B, T)
    old_log_probs_ref: torch.Tensor | None  # shadow pass 1 (shadow steps only)
    tis: torch.Tensor | None  # (B, T) detached TIS weights
    metrics: dict = field(default_factory=dict)  # of the old log-prob pass (TIS)
    old_errors: torch.Tensor | None = None  # (B, T) loss.ratio_noise's old-pass errors


@dataclass
class UpdateOutput:
    log_prob: torch.Tensor  # (b, T) the log-probs the loss saw (FP8, or noised), detached
    metrics: dict  # python floats
    skipped: bool
    clean_log_prob: torch.Tensor | None = None  # before loss.ratio_noise's errors


def run_step(ctx: StepContext, step: int) -> StepResult:
    timer, dp = Timer(), ctx.dp
    bounds_in_use = bounds_metrics(ctx)  # calibration below sets the next step's
    samples = ctx.prompts.for_step(step)
    lo, hi = dp.share(len(samples))  # data parallel: this rank's contiguous share of the groups
    samples = samples[lo:hi]
    with timer("rollout"):
        dp.unshard(ctx.model)
        batch = dp.pad_responses(rollout(ctx, samples, step))
    with timer("reward"):
        rewards, metrics = score(ctx, batch, samples)
    advantages, keep, adv_metrics = advantages_for(ctx, rewards, batch)
    metrics.update(adv_metrics)
    metrics.update(rollout_metrics(batch))
    metrics = dp.mean_metrics(
        metrics,
        {k: (batch.response_mask.sum() if k == "rollout/entropy" else len(batch)) for k in metrics},
    )
    kept = [i for i, k in enumerate(host_list(keep)) if k]
    if dp.sum_int(len(kept)) == 0:
        metrics["train/skipped_empty_batch"] = 1.0
        return StepResult({**metrics, **timer.metrics(), **bounds_in_use})
    spare = batch.select([0])  # a row for lock-step dummy passes when a rank keeps none
    batch = batch.select(kept)
    advantages = advantages[torch.tensor(kept, dtype=torch.long, device=advantages.device)]
    shadow = ctx.is_shadow_step(step)
    with timer("old_log_probs"):
        data = prepare_update(ctx, batch, advantages, shadow, step)
    mismatch = mismatch_metrics(data)
    metrics.update(
        dp.mean_metrics(
            mismatch,
            dict.fromkeys(mismatch, batch.response_mask.sum()),
            max_keys=("actor/tis_raw_weight_max",),
        )
    )
    with timer("update"):
        pooled, upd_metrics, skipped = update_policy(ctx, data, step, shadow, spare)
    metrics.update(upd_metrics)
    responses = None
    if shadow:
        with timer("calibrate"):
            shadow_out, responses = shadow_and_calibrate(ctx, data, pooled, step, loss_bounds(ctx))
            metrics.update(shadow_out)
    metrics["train/shadow_step"] = float(shadow)
    return StepResult({**metrics, **timer.metrics(), **bounds_in_use}, skipped, responses)


def bounds_metrics(ctx: StepContext) -> dict:
    return {"calib/lower": ctx.calibration.lower, "calib/upper": ctx.calibration.upper}


# ------------------------------------------------------------------ rollout and rewards


def rollout(ctx: StepContext, samples, step: int) -> RolloutBatch:
    c = ctx.cfg.rollout
    params = SamplingParams(
        n=c.n, temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens
    )
    prompts = [s.prompt for s in samples]
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
    parsed = scored.parsed
    metrics = {
        "rollout/reward": rewards.mean(),
        "rollout/parsed_frac": sum(parsed) / max(len(parsed), 1),
    }
    return rewards, metrics


def advantages_for(
    ctx: StepContext, rewards: torch.Tensor, batch
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    lc, n = ctx.cfg.loss, ctx.cfg.rollout.n
    shaped = rewards
    if lc.overlong_buffer > 0:
        lengths = batch.response_lengths.float().cpu()
        shaped = rewards + overlong_penalty(
            lengths, ctx.cfg.rollout.max_new_tokens, lc.overlong_buffer, lc.overlong_factor
        )
    adv = grpo_advantages(shaped, n, std_normalize=lc.advantage == "grpo")
    keep = (
        dynamic_sampling_mask(shaped, n)
        if lc.resolved_dynamic_sampling()
        else torch.ones_like(shaped, dtype=torch.bool)
    )
    metrics = {"rollout/shaped_reward": shaped.mean(), "train/kept_frac": keep.float().mean()}
    # keep stays on the host (rewards are host values): the row selection reads nothing back
    return adv.to(ctx.device), keep, metrics


def rollout_metrics(batch) -> dict:
    mask = batch.response_mask.float()
    return {
        "rollout/entropy": masked_mean(batch.entropy.float(), mask),
        "rollout/response_len": batch.response_lengths.float().mean(),
        "rollout/truncated_frac": batch.truncated.float().mean(),
    }


# ------------------------------------------------------------------ old log-probs and TIS


def prepare_update(ctx: StepContext, batch, advantages, shadow: bool, step: int = 0) -> StepData:
    micro = ctx.cfg.train.logprob_micro_batch_size or None
    ctx.dp.unshard(ctx.model)
    with torch.no_grad():
        with use_recipe(ctx.model, ctx.train_recipe), record_nonfinite() as nonfinite:
            old = _log_probs(ctx.model, batch, ctx.temperature, micro)
        if nonfinite:  # the nan old log-probs make this step's updates skip; say where it began
            ctx.log_event(f"non-finite FP8 input in the old log-probs pass: {causes(nonfinite)}")
        old_ref = e_old = None
        if ctx.noise is not None:
            # loss.ratio_noise: the old pass's error, drawn once per step as FP8's is fixed
            # for all of a step's updates; the clean values play the shadow (no extra pass)
            _, e_old = correlated_errors(
                old,
                batch.response_mask,
                sd=ctx.noise[0],
                corr=ctx.noise[1],
                generator=ctx.seeds.generator(step, "noise/old"),
            )
            old, old_ref = old + e_old, old
        elif shadow:  # shadow pass 1: the same weights with quantization switched off
            with high_precision(ctx.model):
                old_ref = _log_probs(ctx.model, batch, ctx.temperature, micro)
    tis, metrics = None, {}
    lc = ctx.cfg.loss
    if lc.tis:
        tis, metrics = tis_weights(
            old,
            batch.log_probs,
            batch.response_mask,
            level=lc.tis_level,
            mode=lc.tis_mode,
            cap=lc.tis_cap,
        )
    return StepData(batch, advantages, old, old_ref, tis, metrics, e_old)


def _log_probs(model, batch, temperature, micro):
    if len(batch) == 0:  # a data-parallel rank whose groups were all filtered out
        return batch.log_probs.clone()
    return compute_log_probs(model, batch, temperature=temperature, micro_batch_size=micro)[0]


def mismatch_metrics(data: StepData) -> dict:
    out = dict(data.metrics)
    out["mismatch/kl_rollout_train"] = k3_kl(
        data.batch.log_probs, data.old_log_probs, data.batch.response_mask
    )
    return out


# ------------------------------------------------------------------ mini-batch updates


def minibatch_indices(ctx: StepContext, size: int, step: int) -> list[list[int]]:
    """The step's mini-batches as local row indices (host ints): the global batch (all ranks'
    rows in rank order) is shuffled and split, and each rank keeps its own rows of every part."""
    offset, total = ctx.dp.row_offset(size)
    perm = torch.randperm(total, generator=ctx.seeds.generator(step, "shuffle"))
    # a part may hold none of this rank's rows: the rank still joins that update's collectives
    return [
        [i - offset for i in host_list(chunk) if offset <= i < offset + size]
        for chunk in perm.chunk(ctx.cfg.train.mini_batches)
        if chunk.numel() > 0
    ]


def update_policy(
    ctx: StepContext, data: StepData, step: int, shadow: bool, spare: RolloutBatch | None = None
) -> tuple[dict, dict, int]:
    """One optimizer update per mini-batch. Returns the pooled tensors (shadow steps), the
    mean metrics and the number of skipped updates."""
    pooled = {"index": [], "log_prob": [], "log_prob_ref": []}
    sums: dict[str, float] = {}
    n_updates = skipped = 0
    for k, rows in enumerate(minibatch_indices(ctx, data.advantages.shape[0], step)):
        idx = torch.tensor(rows, dtype=torch.long, device=ctx.device)
        ctx.dp.unshard(ctx.model)
        ref = noise = None
        if ctx.noise is not None:  # this update's new-pass error, correlated with the old one's
            e_old = data.old_errors[idx]
            noise, _ = correlated_errors(
                e_old,
                data.batch.response_mask[idx],
                sd=ctx.noise[0],
                corr=ctx.noise[1],
                generator=ctx.seeds.generator(step, f"noise/new/{k}"),
                old_errors=e_old,
            )
        elif shadow:  # shadow pass 2: forward-only, same weights as this update's FP8 forward
            with torch.no_grad(), high_precision(ctx.model):
                ref = _log_probs(
                    ctx.model,
                    data.batch.select(rows),
                    ctx.temperature,
                    ctx.cfg.train.logprob_micro_batch_size or None,
                )
        out = update_minibatch(ctx, data, rows, spare, shadow_log_prob=ref, noise=noise)
        if shadow:  # with ratio noise the update's clean log-probs play the shadow
            pooled["log_prob_ref"].append(ref if noise is None else out.clean_log_prob)
        pooled["index"].append(idx)
        pooled["log_prob"].append(out.log_prob)
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + v
        n_updates += 1
        skipped += int(out.skipped)
    metrics = {k: v / max(n_updates, 1) for k, v in sums.items()}
    metrics["train/skipped_updates"] = float(skipped)
    metrics["train/updates"] = float(n_updates)
    return pooled, metrics, skipped


def loss_bounds(ctx: StepContext) -> tuple[float, float]:
    lc = ctx.cfg.loss
    return lc.table.clip_bounds(
        lc.resolved_eps(), relaxed_lower=lc.relaxed_lower, calibrated=ctx.calibration.bounds
    )


def loss_options(ctx: StepContext) -> dict:
    return ctx.cfg.loss.table.loss_options(ctx.cfg.loss)


def micro_slices(n: int, micro: int) -> list[slice]:
    step = micro if micro > 0 else max(n, 1)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def update_minibatch(
    ctx: StepContext,
    data: StepData,
    rows: list[int],
    spare: RolloutBatch | None = None,
    *,
    shadow_log_prob: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> UpdateOutput:
    """Gradient accumulation over micro-batches, weighted so the sum equals the mini-batch loss.

    shadow_log_prob: shadow pass 2 of these rows (oracle clipping, loss.clip_source=bf16).
    noise: the new-pass log-prob errors of these rows (loss.ratio_noise), added to the
    log-probs the loss sees; the gradient is unchanged by a constant."""
    model, dp, cfg = ctx.model, ctx.dp, ctx.cfg
    mb = data.batch.select(rows)
    idx = torch.tensor(rows, dtype=torch.long, device=ctx.device)
    adv, old = data.advantages[idx], data.old_log_probs[idx]
    tis = data.tis[idx] if data.tis is not None else None
    mask = mb.response_mask
    agg = cfg.loss.resolved_agg()
    lower, upper = loss_bounds(ctx)
    loss_name, options = cfg.loss.table.loss, loss_options(ctx)
    if cfg.loss.clip_source == "bf16":  # the clip decision of the BF16 shadow ratio
        loss_name, shadow_old = "oracle_clip", data.old_log_probs_ref[idx]
    # the normalizers of the global mini-batch (all ranks' rows): gradients then add up
    tokens_total = dp.sum(mask.float().sum()).clamp_min(1)
    rows_total = dp.sum_int(mask.shape[0])
    ctx.optimizer.zero_grad(set_to_none=True)
    log_probs, clean, weighted = [mb.log_probs[:0]], [mb.log_probs[:0]], {}
    total_loss = torch.zeros((), device=ctx.device)
    slices = micro_slices(mask.shape[0], cfg.train.micro_batch_size)
    # Non-finite FP8 inputs are recorded, not raised: the nan they leave in the loss or the
    # gradients skips the update below on every rank, where an exception on one rank would
    # leave the others waiting in the gradient all-reduce.
    with use_recipe(model, ctx.train_recipe), record_nonfinite() as nonfinite:
        for i, sl in enumerate(slices):
            sub = mb.select(range(sl.start, sl.stop))
            lp, _ = compute_log_probs(model, sub, temperature=ctx.temperature)
            clean.append(lp.detach())
            if noise is not None:
                lp = lp + noise[sl]
            if loss_name == "oracle_clip":
                options = {
                    "shadow_log_prob": shadow_log_prob[sl],
                    "shadow_old_log_prob": shadow_old[sl],
                }
            loss, metrics = policy_loss(
                loss_name,
                lp,
                old[sl],
                adv[sl],
                mask[sl],
                lower=lower,
                upper=upper,
                agg=agg,
                tis_weights=None if tis is None else tis[sl],
                **options,
            )
            # token-mean pools tokens; the seq-mean family and the constant normalizer pool rows
            w = (
                mask[sl].float().sum() / tokens_total
                if agg == "token-mean"
                else torch.tensor((sl.stop - sl.start) / rows_total, device=ctx.device)
            )
            dp.backward(model, loss * w, last=i == len(slices) - 1)
            total_loss = total_loss + loss.detach() * w
            log_probs.append(lp.detach())
            # the metrics are token means: pool them by tokens (the same as w for token-mean)
            mw = mask[sl].float().sum() / tokens_total
            for k, v in metrics.items():
                weighted[k] = weighted.get(k, 0.0) + v.detach() * (
                    w if k == "actor/pg_loss" else mw
                )
        dp.finish_backward(model, had_backward=bool(slices), zero_loss=_zero_loss(ctx, spare))
    total_loss = dp.sum(total_loss)
    weighted = dp.sum_dict(weighted)
    # before clipping, which spreads one nan over every gradient; kept on the device (no sync)
    grad_flags = grad_finite_flags(model) if cfg.train.fp8_check_finite else None
    grad_norm = dp.clip_gradients(
        model, cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
    )
    # agreed by all ranks (a sum of non-finite flags): all step or all skip
    bad = dp.sum((~(torch.isfinite(total_loss) & torch.isfinite(grad_norm))).to(torch.float32))
    # the one read-back of the mini-batch: the skip decision and every metric together
    names = list(weighted)
    values = torch.stack(
        [x.double() for x in (bad, total_loss, grad_norm, *(weighted[k] for k in names))]
    ).tolist()
    ok = values[0] == 0
    if ok:
        dp.optimizer_step(model, ctx.optimizer)
    else:  # never let a NaN/Inf reach the weights or the optimizer moments
        where = locate(nonfinite, grad_flags)
        ctx.optimizer.zero_grad(set_to_none=True)
        ctx.log_event(
            f"non-finite loss {values[1]} or grad norm {values[2]}: update skipped; {where}"
        )
    out = dict(zip(names, values[3:]))
    out.update({"actor/loss": values[1], "actor/grad_norm": values[2]})
    return UpdateOutput(
        torch.cat(log_probs, 0), out, skipped=not ok, clean_log_prob=torch.cat(clean, 0)
    )


def _zero_loss(ctx: StepContext, spare: RolloutBatch | None):
    """A zero loss through the model, for a rank that must join a collective backward with
    no rows of its own in the mini-batch (FSDP2's reduce-scatter)."""

    def loss() -> torch.Tensor:
        with use_recipe(ctx.model, ctx.train_recipe):
            lp, _ = compute_log_probs(ctx.model, spare, temperature=ctx.temperature)
        return lp.sum() * 0.0

    return loss


__all__ = ["run_step", "StepData", "StepResult", "UpdateOutput", "update_minibatch"]
