"""The gspo loss: a hand example, its gradient against a float64 re-derivation for every
aggregation with TIS weights, micro-batches that add up, and what it refuses. (Its equality
with verl's compute_policy_loss_gspo is in tests/test_integrations_verl.py.)"""

import math
import zlib

import pytest
import torch

from fp8rl.rl import policy_loss, sequence_ratio
from fp8rl.rl.clipping import AGGREGATIONS
from helpers_rl import agg_coefficients, assert_micro_batches_add_up, random_loss_batch

F64 = torch.float64
L, H = 1 - 3e-4, 1 + 4e-4


def test_gspo_hand_example():
    # row 0: log-ratios .001, -.003 (mean -.001), A = -1: s = e^-.001 < L, the row is clipped;
    # row 1: log-ratios 1e-4, 2e-4, 0 (mean 1e-4), A = 2: s = e^1e-4 inside (L, H)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.5, -0.7]], dtype=F64)
    lp = (old + torch.tensor([[1e-3, -3e-3, 5.0], [1e-4, 2e-4, 0.0]], dtype=F64)).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)  # row 0's 5.0 is padding
    adv = torch.tensor([-1.0, 2.0], dtype=F64)
    loss, m = policy_loss("gspo", lp, old, adv, mask, lower=L, upper=H, agg="seq-mean-token-mean")
    s1 = math.exp(1e-4)
    # per token: row 0 -(-1) L (a constant), row 1 -2 s1; each row's token mean, then the mean
    assert loss.item() == pytest.approx((L + -2 * s1) / 2, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, lp)
    # row 1: d(-2 s1 w_t)/d lp_t = -2 s1, times 1/3 (token mean) times 1/2 (rows)
    expected = torch.tensor([[0.0, 0.0, 0.0], [-s1 / 3] * 3], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0)
    # the tokens of clipped responses, over all 5 masked tokens: row 0's two
    assert m["actor/clipfrac_lower_neg"].item() == pytest.approx(2 / 5)
    assert m["actor/clipfrac_upper_pos"].item() == 0.0
    ratios = sequence_ratio(lp.detach(), old, mask)
    torch.testing.assert_close(ratios, torch.tensor([math.exp(-1e-3), s1], dtype=F64))


def random_rows(seed, b=24, t=6, sd=2e-3):
    return random_loss_batch(seed, b, t, sd)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradient_matches_a_float64_rederivation(agg):
    lp, old, adv, mask, tis = random_rows(seed=zlib.crc32(agg.encode()) % 1000)
    loss, _ = policy_loss("gspo", lp, old, adv, mask, lower=L, upper=H, agg=agg, tis_weights=tis)
    (grad,) = torch.autograd.grad(loss, lp)
    # s_b = exp(mean over b's tokens of log r); an unclipped token's loss -A s_b r_t / sg(r_t)
    # has gradient -A s_b; a clipped response's tokens have none
    m = mask.to(F64)
    s = torch.exp(((lp.detach() - old) * m).sum(-1) / m.sum(-1))
    clipped = ((adv < 0) & (s < L)) | ((adv > 0) & (s > H))
    assert clipped.any() and not clipped.all()
    per_token = torch.where(clipped, 0.0, -adv * s)[:, None].expand_as(lp)
    expected = per_token * tis * agg_coefficients(mask, agg)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert (grad[~mask] == 0).all()


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_micro_batches_of_whole_rows_add_up_to_the_mini_batch(agg):
    batch = random_rows(seed=3)
    parts = (slice(0, 5), slice(5, 6), slice(6, 24))
    assert_micro_batches_add_up("gspo", batch, parts, lower=L, upper=H, agg=agg)


def test_the_log_ratio_is_clamped_at_10_from_above_only():
    old = torch.zeros(2, 2, dtype=F64)
    lp = torch.tensor([[12.0, 12.0], [-30.0, -30.0]], dtype=F64).requires_grad_()
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0], dtype=F64)  # no clip: A < 0 above H, A > 0 below L
    loss, m = policy_loss("gspo", lp, old, adv, mask, lower=L, upper=H, agg="token-mean")
    # row 0: s = e^10 (clamped), loss +e^10 per token; row 1: s = e^-30, loss -e^-30
    assert loss.item() == pytest.approx((2 * math.exp(10) - 2 * math.exp(-30)) / 4, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, lp)
    assert (grad[0] == 0).all()  # the clamp binds: no gradient, as in verl
    torch.testing.assert_close(grad[1], torch.full((2,), -math.exp(-30) / 4, dtype=F64))
    assert sequence_ratio(lp.detach(), old, mask)[0].item() == pytest.approx(math.exp(10))


def test_gspo_needs_rows_and_takes_no_options():
    lp, old, adv, mask, _ = random_rows(seed=1)
    flat = torch.ones(5, dtype=torch.bool)
    with pytest.raises(ValueError, match="policy loss 'gspo' .* needs \\(B, T\\) rows"):
        policy_loss("gspo", lp[0, :5], old[0, :5], adv[:5], flat, lower=L, upper=H)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['dual_clip'\].*none"):
        policy_loss("gspo", lp, old, adv, mask, lower=L, upper=H, dual_clip=3.0)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_one_token_responses_make_it_ppo_clip(agg):
    # with T = 1 the sequence ratio is the token ratio, and GSPO is PPO-clip
    lp, old, adv, mask, tis = random_rows(seed=11, t=1)
    mask[:] = True
    lp2 = lp.detach().clone().requires_grad_()
    kw = dict(lower=L, upper=H, agg=agg, tis_weights=tis)
    ours, _ = policy_loss("gspo", lp, old, adv, mask, **kw)
    ppo, _ = policy_loss("ppo_clip", lp2, old, adv, mask, **kw)
    torch.testing.assert_close(ours, ppo, rtol=1e-15, atol=0)
    torch.testing.assert_close(
        torch.autograd.grad(ours, lp)[0], torch.autograd.grad(ppo, lp2)[0], rtol=1e-15, atol=0
    )
