"""Noise injection: the injected errors' sd and correlation, the S/C estimators
from shadow statistics."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.rl.noise import correlated_errors, ratio_noise_sd
from fp8rl.rl.shadow import CORR_KEY, SD_KEY
from helpers_rl import estimated_noise, synthetic_shadow

N = 100_000


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def corrcoef(a, b):
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


# The noised log-probs the ratio-noise ablation feeds the loss, written here on
# correlated_errors alone: the library adds the errors where it uses them.
def noised_log_probs(log_prob, old_log_prob, mask, *, sd, corr, generator, old_errors=None):
    """(log_prob + e_new, old_log_prob + e_old); masked-out positions unchanged."""
    e_new, e_old = correlated_errors(
        log_prob, mask, sd=sd, corr=corr, generator=generator, old_errors=old_errors
    )
    return log_prob + e_new, old_log_prob + e_old.to(old_log_prob.dtype)


def noised_log_ratio(log_prob, old_log_prob, mask, *, sd, corr, generator):
    """The noised log-ratio, 0 where the mask is false."""
    lp, old = noised_log_probs(log_prob, old_log_prob, mask, sd=sd, corr=corr, generator=generator)
    return torch.where(mask.bool(), lp - old.to(lp.dtype), torch.zeros_like(lp))


@pytest.mark.parametrize("sd, corr", [(0.05, 0.0), (0.02, 0.5), (0.1, 0.9), (0.03, -0.4)])
def test_injected_noise_matches_the_request(sd, corr):
    lp = torch.zeros(N, dtype=torch.float64)
    mask = torch.ones(N, dtype=torch.bool)
    new, old = noised_log_probs(lp, lp.clone(), mask, sd=sd, corr=corr, generator=gen())
    assert float(new.std()) == pytest.approx(sd, rel=0.05)
    assert float(old.std()) == pytest.approx(sd, rel=0.05)
    assert corrcoef(new, old) == pytest.approx(corr, rel=0.05, abs=0.01)
    d = noised_log_ratio(lp, lp.clone(), mask, sd=sd, corr=corr, generator=gen(1))
    assert float(d.std()) == pytest.approx(sd * math.sqrt(2 * (1 - corr)), rel=0.05)
    assert ratio_noise_sd(sd, corr) == pytest.approx(sd * math.sqrt(2 * (1 - corr)))


def test_old_pass_errors_stay_fixed_across_updates():
    """Several updates of one step share the old pass: its errors are drawn once and each
    update's new-pass errors are correlated with them."""
    sd, corr = 0.05, 0.6
    like = torch.zeros(N, dtype=torch.float64)
    mask = torch.ones(N, dtype=torch.bool)
    g = gen(3)
    _, e_old = correlated_errors(like, mask, sd=sd, corr=corr, generator=g)
    new1, old1 = correlated_errors(like, mask, sd=sd, corr=corr, generator=g, old_errors=e_old)
    new2, old2 = correlated_errors(like, mask, sd=sd, corr=corr, generator=g, old_errors=e_old)
    assert torch.equal(old1, e_old) and torch.equal(old2, e_old) and not torch.equal(new1, new2)
    for new in (new1, new2):
        assert float(new.std()) == pytest.approx(sd, rel=0.05)
        assert corrcoef(new, e_old) == pytest.approx(corr, rel=0.05)
        assert float((new - e_old).std()) == pytest.approx(ratio_noise_sd(sd, corr), rel=0.05)


def test_noise_is_added_to_the_log_probs_and_keeps_their_gradient():
    torch.manual_seed(0)
    lp = torch.randn(4, 6, requires_grad=True)
    old = torch.randn(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    new_n, old_n = noised_log_probs(lp, old, mask, sd=0.1, corr=0.3, generator=gen())
    e_new, e_old = correlated_errors(lp, mask, sd=0.1, corr=0.3, generator=gen())
    torch.testing.assert_close(new_n, lp + e_new, rtol=0, atol=0)
    torch.testing.assert_close(old_n, old + e_old, rtol=0, atol=0)
    d = noised_log_ratio(lp, old, mask, sd=0.1, corr=0.3, generator=gen())
    torch.testing.assert_close(d, (lp + e_new) - (old + e_old))
    new_n.sum().backward()
    torch.testing.assert_close(lp.grad, torch.ones_like(lp))


def test_masked_tokens_are_untouched():
    torch.manual_seed(0)
    lp = torch.randn(3, 5)
    old = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.4
    lp[~mask] = -math.inf  # padding may hold anything
    new_n, old_n = noised_log_probs(lp, old, mask, sd=0.5, corr=0.2, generator=gen())
    assert torch.equal(new_n[~mask], lp[~mask])
    assert torch.equal(old_n[~mask], old[~mask])
    assert (new_n[mask] != lp[mask]).all() and (old_n[mask] != old[mask]).all()
    d = noised_log_ratio(lp, old, mask, sd=0.5, corr=0.2, generator=gen())
    assert (d[~mask] == 0).all() and torch.isfinite(d).all()


def test_deterministic_with_a_seeded_generator_and_independent_of_the_global_rng():
    lp, old = torch.randn(2, 50), torch.randn(2, 50)
    mask = torch.ones(2, 50, dtype=torch.bool)
    torch.manual_seed(1)
    a = noised_log_probs(lp, old, mask, sd=0.1, corr=0.5, generator=gen(7))
    after_a = torch.rand(1)
    torch.manual_seed(1)
    b = noised_log_probs(lp, old, mask, sd=0.1, corr=0.5, generator=gen(7))
    assert torch.equal(torch.rand(1), after_a)  # the global stream was not drawn from
    c = noised_log_probs(lp, old, mask, sd=0.1, corr=0.5, generator=gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_extreme_correlations_and_zero_sd():
    lp = torch.zeros(1000)
    mask = torch.ones(1000, dtype=torch.bool)
    assert (noised_log_ratio(lp, lp, mask, sd=0.3, corr=1.0, generator=gen()).abs() < 1e-6).all()
    new, old = noised_log_probs(lp, lp, mask, sd=0.3, corr=-1.0, generator=gen())
    torch.testing.assert_close(new, -old)
    new, old = noised_log_probs(lp, lp, mask, sd=0.0, corr=0.5, generator=gen())
    assert (new == 0).all() and (old == 0).all()


def test_noise_keeps_the_dtype():
    lp = torch.zeros(8, dtype=torch.bfloat16)
    new, old = noised_log_probs(lp, lp, torch.ones(8), sd=0.1, corr=0.0, generator=gen())
    assert new.dtype == old.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kw",
    [
        dict(sd=-0.1, corr=0.0),
        dict(sd=0.1, corr=1.5),
        dict(sd=math.nan, corr=0.0),
        dict(sd=math.inf, corr=0.0),
        dict(sd=torch.tensor(0.1), corr=0.0),
    ],
)
def test_bad_noise_parameters_raise(kw):
    with pytest.raises(ValueError):
        noised_log_probs(torch.zeros(3), torch.zeros(3), torch.ones(3), generator=gen(), **kw)


def test_bad_shapes_and_generator_raise():
    with pytest.raises(ValueError, match="shape"):
        correlated_errors(torch.zeros(3), torch.ones(4), sd=0.1, corr=0.0, generator=gen())
    with pytest.raises(ValueError, match="shape"):
        kw = dict(sd=0.1, corr=0.0, generator=gen(), old_errors=torch.zeros(4))
        correlated_errors(torch.zeros(3), torch.ones(3), **kw)
    with pytest.raises(ValueError, match="Generator"):
        noised_log_probs(
            torch.zeros(3), torch.zeros(3), torch.ones(3), sd=0.1, corr=0.0, generator=0
        )


@pytest.mark.parametrize("sd, corr", [(0.02, 0.0), (0.05, 0.6), (0.1, 0.95), (0.03, -0.3)])
def test_estimators_recover_s_and_c(sd, corr):
    out = estimated_noise(*synthetic_shadow(sd, corr, bias=0.01))
    assert set(out) == {SD_KEY, CORR_KEY}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in out.values())
    assert float(out[SD_KEY]) == pytest.approx(sd, rel=0.10)
    assert float(out[CORR_KEY]) == pytest.approx(corr, rel=0.10, abs=0.02)


def test_estimated_noise_reproduces_the_measured_ratio_noise_with_unequal_pass_sds():
    old_fp8, old_shadow, new_fp8, new_shadow, mask = synthetic_shadow(0.05, 0.5)
    new_fp8 = new_shadow + 2.0 * (new_fp8 - new_shadow)  # the new pass is twice as noisy
    out = estimated_noise(old_fp8, old_shadow, new_fp8, new_shadow, mask)
    s, c = float(out[SD_KEY]), float(out[CORR_KEY])
    d = ((new_fp8 - new_shadow) - (old_fp8 - old_shadow))[mask].double()
    assert ratio_noise_sd(s, c) == pytest.approx(float(d.std()), rel=1e-4)


def test_estimators_on_rows_pool_like_flat_tokens():
    old_fp8, old_shadow, new_fp8, new_shadow, mask = synthetic_shadow(0.05, 0.5, n=1200)
    flat = estimated_noise(old_fp8, old_shadow, new_fp8, new_shadow, mask)
    rows = estimated_noise(
        *(x.view(40, 30) for x in (old_fp8, old_shadow, new_fp8, new_shadow, mask))
    )
    for k in flat:
        torch.testing.assert_close(rows[k], flat[k])


def test_estimators_degenerate_inputs_give_nan_not_errors():
    x = torch.randn(5)
    same = estimated_noise(x, x, x, x, torch.ones(5))
    assert float(same[SD_KEY]) == 0 and math.isnan(float(same[CORR_KEY]))
    one = estimated_noise(x, x + 1, x, x + 2, torch.tensor([1, 0, 0, 0, 0]))
    assert math.isnan(float(one[SD_KEY])) and math.isnan(float(one[CORR_KEY]))
