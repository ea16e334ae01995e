"""rl/ inputs by hand: hand-derived tokens for the shadow metrics and Algorithm 1, random
pooled batches (hypothesis), the clip masses and aggregation weights written out
independently, synthetic FP8/BF16 log-probs of a known noise.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

F64 = torch.float64
NAN = float("nan")


def shadow_case():
    """Hand-derived tokens for the shadow metrics (tests/test_rl_shadow.py derives each
    metric from them): (log p, FP8 old log-prob, log phat, BF16 old log-prob, adv, mask)."""
    # BF16 old prob .5 everywhere; per token (phat, p, FP8 old prob q, A):
    #   t0 (.45, .35, .5, -1): rhat .9, r .7  -> FP8 lower clip only (a false lower clip)
    #   t1 (.35, .35, .5, -1): rhat .7, r .7  -> lower clip in both
    #   t2 (.50, .50, .4, +1): rhat 1., r 1.25 -> FP8 upper clip only
    #   t3 (.50, .50, .5, +1): both 1
    #   t4 (.42, .41, .5, -1): rhat .84, r .82 -> no clip
    #   t5 masked out, garbage everywhere.
    phat = [0.45, 0.35, 0.5, 0.5, 0.42, NAN]
    p = [0.35, 0.35, 0.5, 0.5, 0.41, NAN]
    q = [0.5, 0.5, 0.4, 0.5, 0.5, NAN]
    log = lambda xs: torch.log(torch.tensor(xs, dtype=F64))  # noqa: E731
    adv = torch.tensor([-1.0, -1, 1, 1, -1, NAN], dtype=F64)
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    return log(p), log(q), log(phat), log([0.5] * 6), adv, mask


WIDE = dict(max_step=(10.0, 100.0), upper_max=100.0)  # calibration caps that never bind


def hand_case():
    """Hand-derived tokens for Algorithm 1 (tests/test_rl_calibration.py derives the bounds):
    (r, rhat, adv, mask)."""
    # N (A = -1): r = .6 .7 .9 1.0 1.1, rhat = .75 .85 .95 1.0 1.05
    # P (A = +1): r = .9 1.1 1.3 1.5,   rhat = .95 1.05 1.15 1.25
    r = torch.tensor([0.6, 0.7, 0.9, 1.0, 1.1, 0.9, 1.1, 1.3, 1.5], dtype=F64)
    rh = torch.tensor([0.75, 0.85, 0.95, 1.0, 1.05, 0.95, 1.05, 1.15, 1.25], dtype=F64)
    adv = torch.tensor([-1.0] * 5 + [1.0] * 4, dtype=F64)
    return r, rh, adv, torch.ones(9, dtype=torch.bool)


@st.composite
def batches(draw, ties=True):
    """Pooled tokens of a step: rhat near 1 (a policy update), r = rhat times FP8-like noise,
    advantages of both signs away from 0, about 10 % padding."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(90, 400))
    drift = draw(st.floats(0.02, 0.3))
    noise = draw(st.floats(0.0, 0.3))
    tied = ties and draw(st.booleans())
    rng = np.random.default_rng(seed)
    rh = np.exp(drift * rng.standard_normal(n))
    if tied:  # many equal ratios, as bf16 ratios or r == 1 on a first mini-batch produce
        rh = np.round(rh, 2)
    r = rh * np.exp(noise * rng.standard_normal(n))
    adv = rng.choice([-1.0, 1.0], n) * rng.uniform(0.05, 3.0, n)
    mask = rng.random(n) < 0.9
    l0 = draw(st.floats(0.6, 0.9))
    h0 = draw(st.floats(1.1, 1.5))
    t = lambda x: torch.tensor(x, dtype=F64)  # noqa: E731
    return t(r), t(rh), t(adv), torch.tensor(mask), (l0, h0)


def pos_mass(x, adv, mask, upper, strict=False):
    keep = mask & (adv > 0) & ((x < upper) if strict else (x <= upper))
    return float((adv * x)[keep].sum())


def neg_mass(x, adv, mask, lower):
    keep = mask & (adv < 0) & (x >= lower)
    return float((-adv * x)[keep].sum())


def agg_coefficients(mask, agg, norm_len=None):
    """d loss / d loss_i for each aggregation, written out independently."""
    m = mask.to(F64)
    n_b = m.sum(-1, keepdim=True)
    n_seq = (n_b > 0).sum()
    if agg == "token-mean":
        return m / m.sum()
    if agg == "seq-mean-token-mean":
        return m / (n_seq * n_b.clamp_min(1))
    if agg == "seq-mean-token-sum":
        return m / n_seq
    return m / (n_seq * (norm_len or mask.shape[-1]))


def estimated_noise(old_fp8, old_shadow, new_fp8, new_shadow, mask) -> dict:
    """`estimate_noise` of the two passes' FP8 log-probs and their BF16 shadows."""
    from fp8rl.rl.shadow import ShadowRows, estimate_noise

    advantages = torch.zeros_like(new_fp8)  # the noise reads none
    return estimate_noise(ShadowRows(new_fp8, old_fp8, new_shadow, old_shadow, advantages, mask))


def synthetic_shadow(sd, corr, n=100_000, seed=0, bias=0.0):
    """BF16 log-probs of two passes and FP8 ones = BF16 + errors of (sd, corr) + a bias."""
    from fp8rl.rl.noise import correlated_errors

    g = torch.Generator().manual_seed(seed)
    old_shadow = torch.log_softmax(torch.randn(n, 16, generator=g), -1)[:, 0]
    new_shadow = old_shadow + 0.05 * torch.randn(n, generator=g)  # the policy moved a little
    mask = torch.rand(n, generator=g) > 0.1
    e_new, e_old = correlated_errors(
        old_shadow, torch.ones(n, dtype=torch.bool), sd=sd, corr=corr, generator=g
    )
    old_fp8, new_fp8 = old_shadow + e_old + bias, new_shadow + e_new + bias
    # Padding holds garbage the estimator must not read.
    old_fp8[~mask], new_shadow[~mask] = math.inf, math.nan
    return old_fp8, old_shadow, new_fp8, new_shadow, mask


def assert_micro_batches_add_up(loss: str, batch, parts, **kw) -> None:
    """`loss` over the row slices `parts` of `batch` (lp, old, adv, mask, tis), each given the
    whole batch's aggregation counts, sums to the whole batch's loss and gradient (float64:
    to 1e-13)."""
    from fp8rl.rl import aggregation_counts, policy_loss

    lp, old, adv, mask, tis = batch
    full, _ = policy_loss(loss, lp, old, adv, mask, tis_weights=tis, **kw)
    (g_full,) = torch.autograd.grad(full, lp)
    counts = aggregation_counts(mask)
    total = 0
    for rows in parts:
        part, _ = policy_loss(
            loss, lp[rows], old[rows], adv[rows], mask[rows], tis_weights=tis[rows], **counts, **kw
        )
        total = total + part
    (g_parts,) = torch.autograd.grad(total, lp)
    torch.testing.assert_close(total, full, rtol=1e-13, atol=0)
    torch.testing.assert_close(g_parts, g_full, rtol=1e-13, atol=0)


def random_loss_batch(seed: int, rows: int, tokens: int, sd: float):
    """(lp, old, adv, mask, tis) of float64 per-token log-probs: the new ones `sd` from the
    old (lp requires grad), advantages per row, about 20 % padding (never a row's first
    token), TIS weights in [0, 2)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, tokens, generator=g, dtype=F64) * 3
    lp = (old + sd * torch.randn(rows, tokens, generator=g, dtype=F64)).requires_grad_()
    adv = torch.randn(rows, generator=g, dtype=F64)
    mask = torch.rand(rows, tokens, generator=g) < 0.8
    mask[:, 0] = True
    tis = torch.rand(rows, tokens, generator=g, dtype=F64) * 2
    return lp, old, adv, mask, tis
