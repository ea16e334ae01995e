"""Choosing the next token, and the log-prob and entropy of the distribution it came from."""

from __future__ import annotations

import torch

from .params import SamplingParams


def nucleus_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """True for the tokens outside the top-p nucleus of softmax(logits) (last dim).

    The nucleus is the smallest prefix of the tokens sorted by probability whose mass
    reaches `top_p`; the most likely token is always in it.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= top_p
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def log_softmax_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of a distribution given as log-probs (last dim); -inf entries count as 0."""
    p = log_probs.exp()
    return -(p * log_probs.masked_fill(p == 0, 0.0)).sum(-1)


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    with_full: bool = False,
):
    """One token per row of `logits` (B, V).

    Returns (tokens (B,) int64, log_probs (B,) float32, entropy (B,) float32) under the
    distribution sampled from (see `SamplingParams`). Sampling is the exponential race
    argmax(p / E), E ~ Exp(1): one random draw per step, no host sync, and the same
    stream of draws from `generator` on every device it can live on. `with_full` appends
    the sampled tokens' full-softmax log-probs (see `sample_with_noise`).
    """
    race = None
    if not params.is_greedy:
        gen_device = generator.device if generator is not None else logits.device
        race = torch.empty(logits.shape, device=gen_device).exponential_(generator=generator)
        race = race.to(logits.device)
    return sample_with_noise(logits, params, race, with_full=with_full)


def sample_with_noise(
    logits: torch.Tensor,
    params: SamplingParams,
    race: torch.Tensor | None,
    *,
    with_full: bool = False,
):
    """`sample_next` with its Exp(1) draw passed in (the graph decoder draws it outside the graph).

    `race` (B, V) float32 is read, not changed (None for greedy). Returns tokens, log-probs,
    entropy, and with `with_full` the tokens' log-probs under the untruncated
    softmax(logits / temperature): what the trainer's `compute_log_probs` computes, so TIS and
    the mismatch metrics compare like with like (docs/rollout.md, "Top-p and the trainer").
    Without top-p they are the sampled log-probs themselves.
    """
    z = logits.float() / params.score_temperature
    full = z
    if not params.is_greedy and params.top_p < 1.0:
        z = z.masked_fill(nucleus_mask(z, params.top_p), float("-inf"))
    logp = z.log_softmax(-1)
    if params.is_greedy:
        tokens = logp.argmax(-1)
    else:
        tokens = (logp - race.clamp_min(torch.finfo(torch.float32).tiny).log()).argmax(-1)
    token_logp = logp.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = log_softmax_entropy(logp)
    if not with_full:
        return tokens, token_logp, entropy
    if full is z:  # nothing was truncated: the same numbers, not a second pass
        return tokens, token_logp, entropy, token_logp
    full_logp = full.gather(-1, tokens[:, None]).squeeze(-1) - full.logsumexp(-1)
    return tokens, token_logp, entropy, full_logp


def token_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    chunk: int = 1024,
):
    """log softmax(logits / temperature)[targets] in float32, and optionally the entropy.

    `logits` (B, T, V), `targets` (B, T). Works through the time axis in chunks so the
    float32 temporaries stay at (B, chunk, V) whatever the logits' dtype; keeps the graph.
    """
    lps, ents = [], []
    for s in range(0, logits.shape[1], chunk):
        z = logits[:, s : s + chunk].float() / temperature
        lse = z.logsumexp(-1)
        lps.append(z.gather(-1, targets[:, s : s + chunk, None]).squeeze(-1) - lse)
        if with_entropy:
            ents.append(lse - (z.softmax(-1) * z).sum(-1))
    logp = torch.cat(lps, 1) if lps else logits.new_zeros(targets.shape, dtype=torch.float32)
    if not with_entropy:
        return logp, None
    ent = torch.cat(ents, 1) if ents else torch.zeros_like(logp)
    return logp, ent
