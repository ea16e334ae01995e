"""Oracle clipping: BF16-shadow clip decisions, FP8 gradients."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.rl import POLICY_LOSSES, policy_loss

L, H = 0.8, 1.2


def hand_example():
    """Seven tokens, the last padded. FP8 and BF16 clip different tokens:
    0: A<0, FP8 clips (r=0.7), BF16 does not (0.9)  -> -A r, gradient
    1: A<0, BF16 clips (0.7), FP8 does not (0.9)    -> -L A, constant
    2: A>0, FP8 clips (1.3), BF16 does not (1.1)    -> -A r, gradient
    3: A>0, BF16 clips (1.3), FP8 does not (1.1)    -> -H A, constant
    4: A<0, both above H (no clip on that side)     -> -A r
    5: A>0, both below L (no clip on that side)     -> -A r
    """
    r = torch.tensor([0.7, 0.9, 1.3, 1.1, 1.5, 0.5, 1.0], dtype=torch.float64)
    rhat = torch.tensor([0.9, 0.7, 1.1, 1.3, 1.5, 0.5, 1.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0, 2.0, 2.0, -0.5, 1.0, 3.0], dtype=torch.float64)
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0], dtype=torch.bool)
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5, -0.2, -1.0], dtype=torch.float64)
    lp = (old + r.log()).requires_grad_(True)
    # The shadow passes have their own log-probs; only their difference matters.
    old_shadow = old - 0.01
    lp_shadow = old_shadow + rhat.log()
    lp_shadow[6] = -math.inf  # padding in the shadow too
    expected_loss = torch.tensor([0.7, 0.8, -2.6, -2.4, 0.75, -0.5, 0.0], dtype=torch.float64)
    # d(-A r)/d lp = -A r for the gradient-carrying tokens, 0 for the clipped ones.
    expected_grad = torch.tensor([0.7, 0.0, -2.6, 0.0, 0.75, -0.5, 0.0], dtype=torch.float64)
    return lp, old, adv, mask, lp_shadow, old_shadow, expected_loss, expected_grad


def test_per_token_loss_and_gradient_match_the_hand_computation():
    lp, old, adv, mask, lp_shadow, old_shadow, expected_loss, expected_grad = hand_example()
    fn = POLICY_LOSSES["oracle_clip"]
    z = torch.zeros_like(old)
    per_token, metrics = fn(
        torch.where(mask, lp, z),
        torch.where(mask, old, z),
        torch.where(mask, adv, z),
        mask,
        lower=L,
        upper=H,
        log_prob_shadow=lp_shadow,
        old_log_prob_shadow=old_shadow,
    )
    torch.testing.assert_close(per_token, expected_loss)
    per_token.sum().backward()
    torch.testing.assert_close(lp.grad, expected_grad)

    lp.grad = None
    loss, metrics = policy_loss(
        "oracle_clip",
        lp,
        old,
        adv,
        mask,
        lower=L,
        upper=H,
        log_prob_shadow=lp_shadow,
        old_log_prob_shadow=old_shadow,
    )
    torch.testing.assert_close(loss, expected_loss.sum() / 6)
    loss.backward()
    torch.testing.assert_close(lp.grad, expected_grad / 6)
    # Applied clips are the shadow's (tokens 1 and 3); FP8 alone would clip 0 and 2.
    assert float(metrics["actor/clipfrac_lower_neg"]) == pytest.approx(1 / 6)
    assert float(metrics["actor/clipfrac_upper_pos"]) == pytest.approx(1 / 6)
    assert float(metrics["actor/clipfrac"]) == pytest.approx(2 / 6)
    assert float(metrics["actor/oracle_fp8_clipfrac"]) == pytest.approx(2 / 6)
    assert float(metrics["actor/oracle_flip_frac"]) == pytest.approx(4 / 6)
    assert all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_with_the_shadow_ratio_equal_to_fp8_it_is_ppo_clip(agg):
    torch.manual_seed(0)
    B, T = 6, 9
    old = -torch.rand(B, T, dtype=torch.float64) * 3
    base = old + 0.3 * torch.randn(B, T, dtype=torch.float64)  # ratios well beyond [L, H]
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.rand(B, T) > 0.25
    shadow_shift = 0.7  # the shadow's log-probs differ, its ratios do not

    def run(name, **kw):
        lp = base.clone().requires_grad_(True)
        loss, metrics = policy_loss(name, lp, old, adv, mask, lower=L, upper=H, agg=agg, **kw)
        loss.backward()
        return loss, lp.grad, metrics

    ref = run("ppo_clip")
    got = run(
        "oracle_clip", log_prob_shadow=base + shadow_shift, old_log_prob_shadow=old + shadow_shift
    )
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1])
    for k in (
        "actor/clipfrac_lower_neg",
        "actor/clipfrac_upper_pos",
        "actor/clipfrac",
        "actor/ppo_kl",
        "actor/ratio_mean",
        "actor/pg_loss",
    ):
        torch.testing.assert_close(got[2][k], ref[2][k])
    assert float(ref[2]["actor/clipfrac"]) > 0  # the comparison covers clipped tokens
    assert float(got[2]["actor/oracle_flip_frac"]) == 0


def test_per_token_equal_to_ppo_clip_too():
    lp, old, adv, mask, *_ = hand_example()
    z = torch.zeros_like(old)
    args = (
        torch.where(mask, lp, z).detach(),
        torch.where(mask, old, z),
        torch.where(mask, adv, z),
        mask,
    )
    a, _ = POLICY_LOSSES["ppo_clip"](*args, lower=L, upper=H)
    b, _ = POLICY_LOSSES["oracle_clip"](
        *args, lower=L, upper=H, log_prob_shadow=args[0], old_log_prob_shadow=args[1]
    )
    torch.testing.assert_close(a, b)


def test_missing_or_misshapen_shadow_raises():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="log_prob_shadow"):
        policy_loss("oracle_clip", x, x, torch.zeros(2), torch.ones(2, 3), lower=L, upper=H)
    with pytest.raises(ValueError, match="shape"):
        policy_loss(
            "oracle_clip",
            x,
            x,
            torch.zeros(2),
            torch.ones(2, 3),
            lower=L,
            upper=H,
            log_prob_shadow=torch.zeros(3, 2),
            old_log_prob_shadow=x,
        )
