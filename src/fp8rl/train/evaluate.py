"""Accuracy of a policy on a task split: greedy mean@1, and pass@k / mean@k with sampling."""

from __future__ import annotations

import torch

from ..rollout import SamplingParams, compute_log_probs
from ..tasks import pass_at_k, prompt_inputs, score_batch


def evaluate_policy(
    model,
    engine,
    task,
    *,
    split: str = "test",
    limit: int | None = None,
    max_new_tokens: int = 16,
    k: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 256,
    problems: list | None = None,
) -> dict:
    """k == 1: greedy decoding; k > 1: k samples per prompt at `temperature`. `problems`, when
    given, receives one row per problem (its index in the split, question, answer, k and how
    many of its k samples were correct): accuracies compared paired by problem."""
    samples = task.samples(split)
    if limit is not None:  # 0 evaluates nothing, not the whole split
        samples = samples[:limit]
    if not samples:
        return {}
    params = (
        SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
        if k == 1
        else SamplingParams(n=k, temperature=temperature, max_new_tokens=max_new_tokens)
    )
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    correct, parsed = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(samples), batch_prompts):
            chunk = samples[start : start + batch_prompts]
            batch = engine.generate(prompt_inputs(chunk), params, generator=gen)
            scored = score_batch(task, batch.texts, [chunk[i] for i in batch.prompt_index.tolist()])
            correct += [float(score >= 1.0) for score in scored.scores]
            parsed += scored.parsed
    finally:
        model.train(was_training)
    scores = torch.tensor(correct).view(len(samples), k)
    if problems is not None:
        problems += problem_rows(samples, scores)
    out = {f"eval/mean@{k}": float(scores.mean()), "eval/parsed_frac": sum(parsed) / len(parsed)}
    if k > 1:
        c = scores.sum(1).long().tolist()
        out[f"eval/pass@{k}"] = sum(pass_at_k(k, ci, k) for ci in c) / len(c)
    return out


def problem_rows(samples, scores: torch.Tensor) -> list[dict]:
    """One row per problem of an (n problems, k) 0/1 score table."""
    k = scores.shape[1]
    return [
        {
            "index": i,
            "question": s.question or s.prompt,
            "answer": s.answer,
            "k": k,
            "correct": int(row.sum()),
        }
        for i, (s, row) in enumerate(zip(samples, scores, strict=True))
    ]


def sampled_entropy(
    model,
    engine,
    task,
    *,
    split: str = "train",
    limit: int | None = None,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 256,
) -> dict:
    """One sample per prompt at `temperature`: the mean entropy (nats) of the sampling
    distribution over every response token (rollout/entropy's definition), the mean
    response length and the share of samples that score 1 (`accuracy`)."""
    samples = task.samples(split)[:limit] if limit else task.samples(split)
    if not samples:
        return {}
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=max_new_tokens)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    ent_sum, tokens, correct = 0.0, 0.0, 0.0
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(samples), batch_prompts):
            chunk = samples[start : start + batch_prompts]
            batch = engine.generate(prompt_inputs(chunk), params, generator=gen)
            mask = batch.response_mask.float()
            entropy = batch.entropy
            if entropy is None:  # an engine that leaves it out (vLLM): the model's forward
                with torch.no_grad():
                    _, entropy = compute_log_probs(
                        model, batch, temperature=temperature, with_entropy=True
                    )
            ent_sum += float((entropy.float() * mask).sum())
            tokens += float(mask.sum())
            scored = score_batch(task, batch.texts, [chunk[i] for i in batch.prompt_index.tolist()])
            correct += sum(float(score >= 1.0) for score in scored.scores)
    finally:
        model.train(was_training)
    return {
        "entropy": ent_sum / max(tokens, 1.0),
        "response_len": tokens / len(samples),
        "accuracy": correct / len(samples),
    }
