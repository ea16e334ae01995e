"""Supervised warm start: teacher-forced cross-entropy on (prompt, target) pairs.

RL from a random model gets no reward to learn from; the demo first teaches the task's
format and part of its answers, as a base model would know them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..tasks.sft import encode_pairs


def warm_start(
    model,
    tokenizer,
    pairs,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    progress=None,
    should_stop=None,
    saved=None,
) -> list[float]:
    """AdamW with a short warmup and cosine decay over `steps`; returns the loss curve.

    `should_stop(step, loss) -> bool`, when given, ends the warm start early (the demo stops
    once a target accuracy is reached, so RL starts with room to improve). `saved`, when
    given, keeps the build across a kill: `saved.resume(opt, sched, gen)` loads what an
    earlier build left and returns its loss curve, `saved.save(opt, sched, gen, losses)`
    runs after every `saved.every` steps."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
        ),
    )
    model.train()
    losses = saved.resume(opt, sched, gen) if saved is not None else []
    for _ in range(len(losses), steps):
        idx = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        ids, att, lab = encode_pairs(tokenizer, [pairs[i] for i in idx], device)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), lab[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(len(losses), losses[-1])
        if should_stop is not None and should_stop(len(losses), losses[-1]):
            break
        if saved is not None and len(losses) % saved.every == 0 and len(losses) < steps:
            saved.save(opt, sched, gen, losses)
    return losses
