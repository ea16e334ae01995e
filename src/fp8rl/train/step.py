"""One RL step, as docs/training.md lays it out, composed of small functions.

    rollout (rollout recipe) -> rewards -> advantages (+ DAPO filter, overlong shaping)
    -> old log-probs (training recipe, no grad)  [+ shadow pass 1: BF16 old log-probs]
    -> mini-batch updates                        [+ shadow pass 2 before each update]
    -> shadow diagnostics and, for `calibrated`, the pool and (at refit steps) the next bounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..fp8 import high_precision, record_nonfinite, use_recipe
from ..rl.advantages import dynamic_sampling_mask, grpo_advantages, overlong_penalty
from ..rl.diagnostics import high_entropy_lower_clip_share, k3_kl, shadow_metrics
from ..rl.losses import policy_loss
from ..rl.tis import tis_weights
from ..rollout import RolloutBatch, SamplingParams, compute_log_probs
from ..utils import masked_mean

LOSS_NAMES = {"grpo": "ppo_clip", "dapo": "ppo_clip", "cispo": "cispo", "bapo": "bapo",
              "relax_lower": "relax_lower", "calibrated": "calibrated"}


@dataclass
class StepData:
    """The batch of one step after filtering, with everything the updates need."""
    batch: object  # RolloutBatch
    advantages: torch.Tensor  # (B,)
    old_log_probs: torch.Tensor  # (B, T)
    old_log_probs_ref: torch.Tensor | None  # shadow pass 1 (calibration steps only)
    tis: torch.Tensor | None  # (B, T) detached TIS weights


def run_step(t, step: int) -> dict:
    """One full step; `t` is the Trainer (its fields: cfg, model, optimizer, engine, task...)."""
    timer, dp = _Timer(), t.dp
    bounds_in_use = t.bounds_metrics()  # calibration below sets the next step's
    samples = t.prompts_for_step(step)
    lo, hi = dp.share(len(samples))  # data parallel: this rank's contiguous share of the groups
    samples = samples[lo:hi]
    with timer("rollout"):
        dp.unshard(t.model)
        batch = dp.pad_responses(rollout(t, samples, step))
    with timer("reward"):
        rewards, metrics = score(t, batch, samples)
    advantages, keep, adv_metrics = advantages_for(t, rewards, batch)
    metrics.update(adv_metrics)
    metrics.update(rollout_metrics(batch))
    metrics = dp.mean_metrics(metrics, {k: (batch.response_mask.sum() if k == "rollout/entropy" else len(batch))
                                        for k in metrics})
    if dp.sum_int(int(keep.sum())) == 0:
        metrics["train/skipped_empty_batch"] = 1.0
        return {**metrics, **timer.metrics(), **bounds_in_use}
    dp.spare = batch.select([0])  # a row for lock-step dummy passes when a rank keeps none
    batch, advantages = batch.select(keep.nonzero().squeeze(1)), advantages[keep]
    shadow = t.is_shadow_step(step)
    with timer("old_log_probs"):
        data = prepare_update(t, batch, advantages, shadow)
    mismatch = mismatch_metrics(t, data)
    metrics.update(dp.mean_metrics(mismatch, dict.fromkeys(mismatch, batch.response_mask.sum()),
                                   max_keys=("actor/tis_raw_weight_max",)))
    with timer("update"):
        pooled, upd_metrics = update_policy(t, data, step, shadow)
    metrics.update(upd_metrics)
    if shadow:
        with timer("calibrate"):
            metrics.update(shadow_and_calibrate(t, data, pooled, step))
    metrics["train/shadow_step"] = float(shadow)
    return {**metrics, **timer.metrics(), **bounds_in_use}


# ------------------------------------------------------------------ rollout and rewards


def rollout(t, samples, step: int):
    c = t.cfg.rollout
    params = SamplingParams(n=c.n, temperature=c.temperature, top_p=c.top_p,
                            max_new_tokens=c.max_new_tokens)
    prompts = [t.task_prompt(s) for s in samples]
    # one generate per rollout shard, each with its own generator (see Trainer.rollout_parts)
    batches = [t.engine.generate(prompts[lo:hi], params, generator=t.generator_for(step, key))
               for key, lo, hi in t.rollout_parts(len(prompts))]
    return batches[0] if len(batches) == 1 else RolloutBatch.concat(batches)


def score(t, batch, samples) -> tuple[torch.Tensor, dict]:
    scores, parsed = [], []
    for text, idx in zip(batch.texts, batch.prompt_index.tolist()):
        result = t.task.reward(text, samples[idx])
        scores.append(float(result.score))
        parsed.append(float(result.info.get("parsed", True)))
    rewards = torch.tensor(scores, dtype=torch.float32)
    metrics = {"rollout/reward": rewards.mean(), "rollout/parsed_frac": sum(parsed) / max(len(parsed), 1)}
    return rewards, metrics


def advantages_for(t, rewards: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    lc, n = t.cfg.loss, t.cfg.rollout.n
    shaped = rewards
    if lc.overlong_buffer > 0:
        lengths = batch.response_lengths.float().cpu()
        shaped = rewards + overlong_penalty(lengths, t.cfg.rollout.max_new_tokens, lc.overlong_buffer,
                                            lc.overlong_factor)
    adv = grpo_advantages(shaped, n, std_normalize=lc.advantage == "grpo")
    keep = (dynamic_sampling_mask(shaped, n) if lc.resolved_dynamic_sampling()
            else torch.ones_like(shaped, dtype=torch.bool))
    metrics = {"rollout/shaped_reward": shaped.mean(), "train/kept_frac": keep.float().mean()}
    return adv.to(t.device), keep.to(t.device), metrics


def rollout_metrics(batch) -> dict:
    mask = batch.response_mask.float()
    return {
        "rollout/entropy": masked_mean(batch.entropy.float(), mask),
        "rollout/response_len": batch.response_lengths.float().mean(),
        "rollout/truncated_frac": batch.truncated.float().mean(),
    }


# ------------------------------------------------------------------ old log-probs and TIS


def prepare_update(t, batch, advantages, shadow: bool) -> StepData:
    micro = t.cfg.train.logprob_micro_batch_size or None
    temp = t.cfg.rollout.temperature
    t.dp.unshard(t.model)
    with torch.no_grad():
        with use_recipe(t.model, t.train_recipe), record_nonfinite() as nonfinite:
            old = _log_probs(t.model, batch, temp, micro)
        if nonfinite:  # the nan old log-probs make this step's updates skip; say where it began
            t.log_event(f"non-finite FP8 input in the old log-probs pass: {_causes(nonfinite)}")
        old_ref = None
        if shadow:  # shadow pass 1: the same weights with quantization switched off
            with high_precision(t.model):
                old_ref = _log_probs(t.model, batch, temp, micro)
    tis = None
    lc = t.cfg.loss
    if lc.tis:
        tis, tis_metrics = tis_weights(old, batch.log_probs, batch.response_mask, level=lc.tis_level,
                                       mode=lc.tis_mode, cap=lc.tis_cap)
        t.pending_metrics.update(tis_metrics)
    return StepData(batch, advantages, old, old_ref, tis)


def _log_probs(model, batch, temperature, micro):
    if len(batch) == 0:  # a data-parallel rank whose groups were all filtered out
        return batch.log_probs.clone()
    return compute_log_probs(model, batch, temperature=temperature, micro_batch_size=micro)[0]


def mismatch_metrics(t, data: StepData) -> dict:
    out = dict(t.pending_metrics)
    t.pending_metrics.clear()
    mask = data.batch.response_mask
    out["mismatch/kl_rollout_train"] = k3_kl(data.batch.log_probs, data.old_log_probs, mask)
    return out


# ------------------------------------------------------------------ mini-batch updates


def minibatch_indices(t, size: int, step: int) -> list[torch.Tensor]:
    """The step's mini-batches as local row indices: the global batch (all ranks' rows in rank
    order) is shuffled and split, and each rank keeps its own rows of every part."""
    offset, total = t.dp.row_offset(size)
    perm = torch.randperm(total, generator=t.generator_for(step, "shuffle"))
    return [chunk[(chunk >= offset) & (chunk < offset + size)] - offset
            for chunk in perm.chunk(t.cfg.train.mini_batches) if chunk.numel() > 0]


def update_policy(t, data: StepData, step: int, shadow: bool) -> tuple[dict, dict]:
    """One optimizer update per mini-batch. Returns pooled tensors (shadow steps) and metrics."""
    pooled = {"index": [], "log_prob": [], "log_prob_ref": []}
    sums: dict[str, float] = {}
    n_updates = 0
    for idx in minibatch_indices(t, data.advantages.shape[0], step):
        idx = idx.to(t.device)
        t.dp.unshard(t.model)
        if shadow:  # shadow pass 2: forward-only, same weights as this update's FP8 forward
            with torch.no_grad(), high_precision(t.model):
                ref = _log_probs(t.model, data.batch.select(idx), t.cfg.rollout.temperature,
                                 t.cfg.train.logprob_micro_batch_size or None)
            pooled["log_prob_ref"].append(ref)
        log_prob, metrics = update_minibatch(t, data, idx)
        pooled["index"].append(idx)
        pooled["log_prob"].append(log_prob)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n_updates += 1
    out = {k: v / max(n_updates, 1) for k, v in sums.items() if not k.startswith("train/skipped")}
    out["train/skipped_updates"] = sums.get("train/skipped_update", 0.0)
    out["train/updates"] = float(n_updates)
    return pooled, out


def loss_bounds(t) -> tuple[float, float]:
    lc = t.cfg.loss
    if lc.mode == "calibrated":
        return t.calibration.lower, t.calibration.upper
    low, high = lc.resolved_eps()
    if lc.mode == "relax_lower":
        return lc.relaxed_lower, 1 + high
    return 1 - low, 1 + high


def loss_options(t) -> dict:
    lc = t.cfg.loss
    opts = {}
    if lc.dual_clip is not None and LOSS_NAMES[lc.mode] in ("ppo_clip", "calibrated", "relax_lower"):
        opts["dual_clip"] = lc.dual_clip
    if lc.mode == "bapo":
        opts["target"] = lc.bapo_target
    return opts


def micro_slices(n: int, micro: int) -> list[slice]:
    step = micro if micro > 0 else max(n, 1)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def update_minibatch(t, data: StepData, idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Gradient accumulation over micro-batches, weighted so the sum equals the mini-batch loss."""
    mb = data.batch.select(idx)
    adv, old = data.advantages[idx], data.old_log_probs[idx]
    tis = data.tis[idx] if data.tis is not None else None
    mask = mb.response_mask
    agg = t.cfg.loss.resolved_agg()
    lower, upper = loss_bounds(t)
    dp = t.dp
    # the normalizers of the global mini-batch (all ranks' rows): gradients then add up
    tokens_total = dp.sum(mask.float().sum()).clamp_min(1)
    rows_total = dp.sum_int(mask.shape[0])
    t.optimizer.zero_grad(set_to_none=True)
    log_probs, weighted = [mb.log_probs[:0]], {}
    total_loss = torch.zeros((), device=t.device)
    slices = micro_slices(mask.shape[0], t.cfg.train.micro_batch_size)
    # Non-finite FP8 inputs are recorded, not raised: the nan they leave in the loss or the
    # gradients skips the update below on every rank, where an exception on one rank would
    # leave the others waiting in the gradient all-reduce.
    with use_recipe(t.model, t.train_recipe), record_nonfinite() as nonfinite:
        for i, sl in enumerate(slices):
            sub = mb.select(torch.arange(sl.start, sl.stop, device=t.device))
            lp, _ = compute_log_probs(t.model, sub, temperature=t.cfg.rollout.temperature)
            loss, metrics = policy_loss(LOSS_NAMES[t.cfg.loss.mode], lp, old[sl], adv[sl], mask[sl],
                                        lower=lower, upper=upper, agg=agg,
                                        tis_weights=None if tis is None else tis[sl], **loss_options(t))
            # token-mean pools tokens; the seq-mean family and the constant normalizer pool rows
            w = (mask[sl].float().sum() / tokens_total if agg == "token-mean"
                 else torch.tensor((sl.stop - sl.start) / rows_total, device=t.device))
            dp.backward(t.model, loss * w, last=i == len(slices) - 1)
            total_loss = total_loss + loss.detach() * w
            log_probs.append(lp.detach())
            # the metrics are token means: pool them by tokens (the same as w for token-mean)
            mw = mask[sl].float().sum() / tokens_total
            for k, v in metrics.items():
                weighted[k] = weighted.get(k, 0.0) + v.detach() * (w if k == "actor/pg_loss" else mw)
        dp.finish_backward(t, had_backward=bool(slices))
    total_loss = dp.sum(total_loss)
    weighted = dp.sum_dict(weighted)
    # before clipping, which spreads one nan over every gradient; kept on the device (no sync)
    grad_flags = _grad_finite_flags(t.model) if t.cfg.train.fp8_check_finite else None
    grad_norm = dp.clip_gradients(t.model, t.cfg.train.grad_clip if t.cfg.train.grad_clip > 0 else float("inf"))
    finite = bool(torch.isfinite(total_loss)) and bool(torch.isfinite(grad_norm))
    ok = dp.sum_int(int(not finite)) == 0  # agreed by all ranks: all step or all skip
    if ok:
        dp.optimizer_step(t.model, t.optimizer)
    else:  # never let a NaN/Inf reach the weights or the optimizer moments
        where = _locate(t, nonfinite, grad_flags)
        t.optimizer.zero_grad(set_to_none=True)
        t.skipped_updates += 1
        t.log_event(f"non-finite loss {float(total_loss)} or grad norm {float(grad_norm)}: "
                    f"update skipped; {where}")
    out = {k: float(v) for k, v in weighted.items()}
    out.update({"actor/loss": float(total_loss), "actor/grad_norm": float(grad_norm),
                "train/skipped_update": float(not ok)})
    return torch.cat(log_probs, 0), out


def _causes(names: list[str], most: int = 3) -> str:
    shown = ", ".join(dict.fromkeys(names[:most]))
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _grad_finite_flags(model) -> list[tuple[str, torch.Tensor]]:
    flags = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None:
            g = g.to_local() if hasattr(g, "to_local") else g  # an FSDP shard: this rank's part
            flags.append((name, torch.isfinite(g).all()))
    return flags


def _locate(t, nonfinite: list[str], grad_flags) -> str:
    """Where the non-finite values began, as far as train.fp8_check_finite lets us know."""
    if grad_flags is None:
        return "cause not located (train.fp8_check_finite is off)"
    parts = []
    if nonfinite:
        parts.append(f"non-finite FP8 inputs: {_causes(nonfinite)}")
    bad = [name for name, ok in grad_flags if not bool(ok)]
    if bad:
        parts.append(f"non-finite gradients of {_causes(bad)}")
    return "; ".join(parts) or "no non-finite FP8 input or gradient on this rank"


# ------------------------------------------------------------------ shadow diagnostics and calibration


def shadow_and_calibrate(t, data: StepData, pooled: dict, step: int) -> dict:
    idx = torch.cat(pooled["index"])
    # Algorithm 1 and the diagnostics run on the global batch: every rank gathers all rows
    g = t.dp.gather_rows({
        "log_prob": torch.cat(pooled["log_prob"]), "log_prob_ref": torch.cat(pooled["log_prob_ref"]),
        "old": data.old_log_probs[idx], "old_ref": data.old_log_probs_ref[idx],
        "mask": data.batch.response_mask[idx], "adv": data.advantages[idx], "entropy": data.batch.entropy[idx]})
    log_prob, log_prob_ref, old, old_ref, mask = g["log_prob"], g["log_prob_ref"], g["old"], g["old_ref"], g["mask"]
    adv = g["adv"].unsqueeze(1).expand_as(old)
    bounds = loss_bounds(t)
    nominal = t.calibration.nominal
    metrics = shadow_metrics(log_prob, old, log_prob_ref, old_ref, adv, mask, bounds=bounds, nominal=nominal)
    ratio = torch.exp((log_prob - old).clamp(-20, 20))
    ratio_ref = torch.exp((log_prob_ref - old_ref).clamp(-20, 20))
    metrics["shadow/high_entropy_lower_clip_share"] = high_entropy_lower_clip_share(
        ratio, adv, mask, g["entropy"], bounds[0])
    if t.cfg.loss.mode == "calibrated":
        result = t.calibration.observe(step, ratio, ratio_ref, adv, mask)
        if result is not None:  # a refit step
            # calib/lower and calib/upper stay the bounds this step used; the new ones apply next
            new = result.metrics()
            new["calib/next_lower"], new["calib/next_upper"] = new.pop("calib/lower"), new.pop("calib/upper")
            metrics.update(new)
    return metrics


class _Timer:
    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timer.times[name] = timer.times.get(name, 0.0) + time.perf_counter() - self.t0

        return _Ctx()

    def metrics(self) -> dict:
        out = {f"time/{k}": v for k, v in self.times.items()}
        out["time/step"] = sum(self.times.values())
        return out


__all__ = ["run_step", "StepData", "LOSS_NAMES"]
