"""Noise injection: the injected errors' sd and correlation, the S/C estimators
from shadow statistics, and reading them back from a run folder."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fp8rl.errors import ConfigError
from fp8rl.rl.noise import (
    CORR_KEY,
    SD_KEY,
    correlated_errors,
    estimate_noise,
    ratio_noise_sd,
    read_noise_calibration,
)

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


def synthetic_shadow(sd, corr, n=N, seed=0, bias=0.0):
    """BF16 log-probs of two passes and FP8 ones = BF16 + errors of (sd, corr) + a bias."""
    g = torch.Generator().manual_seed(seed)
    old_ref = torch.log_softmax(torch.randn(n, 16, generator=g), -1)[:, 0]
    new_ref = old_ref + 0.05 * torch.randn(n, generator=g)  # the policy moved a little
    mask = torch.rand(n, generator=g) > 0.1
    e_new, e_old = correlated_errors(
        old_ref, torch.ones(n, dtype=torch.bool), sd=sd, corr=corr, generator=g
    )
    old_fp8, new_fp8 = old_ref + e_old + bias, new_ref + e_new + bias
    # Padding holds garbage the estimator must not read.
    old_fp8[~mask], new_ref[~mask] = math.inf, math.nan
    return old_fp8, old_ref, new_fp8, new_ref, mask


@pytest.mark.parametrize("sd, corr", [(0.02, 0.0), (0.05, 0.6), (0.1, 0.95), (0.03, -0.3)])
def test_estimators_recover_s_and_c(sd, corr):
    out = estimate_noise(*synthetic_shadow(sd, corr, bias=0.01))
    assert set(out) == {SD_KEY, CORR_KEY}
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in out.values())
    assert float(out[SD_KEY]) == pytest.approx(sd, rel=0.10)
    assert float(out[CORR_KEY]) == pytest.approx(corr, rel=0.10, abs=0.02)


def test_estimated_noise_reproduces_the_measured_ratio_noise_with_unequal_pass_sds():
    old_fp8, old_ref, new_fp8, new_ref, mask = synthetic_shadow(0.05, 0.5)
    new_fp8 = new_ref + 2.0 * (new_fp8 - new_ref)  # the new pass is twice as noisy
    out = estimate_noise(old_fp8, old_ref, new_fp8, new_ref, mask)
    s, c = float(out[SD_KEY]), float(out[CORR_KEY])
    d = ((new_fp8 - new_ref) - (old_fp8 - old_ref))[mask].double()
    assert ratio_noise_sd(s, c) == pytest.approx(float(d.std()), rel=1e-4)


def test_estimators_on_rows_pool_like_flat_tokens():
    old_fp8, old_ref, new_fp8, new_ref, mask = synthetic_shadow(0.05, 0.5, n=1200)
    flat = estimate_noise(old_fp8, old_ref, new_fp8, new_ref, mask)
    rows = estimate_noise(*(x.view(40, 30) for x in (old_fp8, old_ref, new_fp8, new_ref, mask)))
    for k in flat:
        torch.testing.assert_close(rows[k], flat[k])


def test_estimators_degenerate_inputs_give_nan_not_errors():
    x = torch.randn(5)
    same = estimate_noise(x, x, x, x, torch.ones(5))
    assert float(same[SD_KEY]) == 0 and math.isnan(float(same[CORR_KEY]))
    one = estimate_noise(x, x + 1, x, x + 2, torch.tensor([1, 0, 0, 0, 0]))
    assert math.isnan(float(one[SD_KEY])) and math.isnan(float(one[CORR_KEY]))


def write_metrics(run_dir, rows, extra_lines=()):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_read_noise_calibration_means_steps_from_one(tmp_path):
    rows = [
        {"step": 0, SD_KEY: 9.0, CORR_KEY: 0.0},  # left out: step 0
        {"step": 1, SD_KEY: 0.02, CORR_KEY: 0.4, "actor/pg_loss": 0.1},
        {"step": 2, SD_KEY: None, CORR_KEY: None},  # NaN written as null: skipped
        {"step": 3, SD_KEY: 0.04, CORR_KEY: 0.6},
        {"step": 4, "actor/pg_loss": 0.3},  # no shadow pass this step
    ]
    write_metrics(tmp_path / "run", rows, extra_lines=['{"step": 5, "shadow/logprob_err_sd": 0.'])
    s, c = read_noise_calibration(tmp_path / "run")
    assert s == pytest.approx(0.03) and c == pytest.approx(0.5)
    s0, c0 = read_noise_calibration(str(tmp_path / "run"), min_step=0)
    assert s0 == pytest.approx((9.0 + 0.06) / 3) and c0 == pytest.approx(1.0 / 3)


def test_read_noise_calibration_recovers_synthetic_s_and_c(tmp_path):
    rows = []
    for step in range(1, 6):
        out = estimate_noise(*synthetic_shadow(0.04, 0.7, n=20_000, seed=step))
        rows.append({"step": step, **{k: float(v) for k, v in out.items()}})
    write_metrics(tmp_path / "fp8run", rows)
    s, c = read_noise_calibration(tmp_path / "fp8run")
    assert s == pytest.approx(0.04, rel=0.10) and c == pytest.approx(0.7, rel=0.10)


def test_read_noise_calibration_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="metrics.jsonl") as e:
        read_noise_calibration(tmp_path / "nope")
    assert "\n" not in str(e.value) and e.value.key == "loss.ratio_noise.auto"
    write_metrics(
        tmp_path / "bf16",
        [{"step": 1, "actor/pg_loss": 0.1}, {"step": 0, SD_KEY: 0.1, CORR_KEY: 0.1}],
    )
    with pytest.raises(ConfigError, match=str(tmp_path / "bf16" / "metrics.jsonl")) as e:
        read_noise_calibration(tmp_path / "bf16")
    assert "\n" not in str(e.value)
