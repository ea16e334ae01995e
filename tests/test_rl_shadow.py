"""The shadow phase the Trainer, TRL and verl share (rl/shadow.py): its metrics against hand
computations and the diagnostic functions it composes, the next bounds under `calib/next_*`,
and a state it feeds only when the state takes observations."""

import math
import statistics

import pytest
import torch

from fp8rl.rl import (
    CalibrationState,
    ShadowRows,
    calibrate_bounds,
    high_entropy_lower_clip_share,
    ratio,
    shadow_metrics,
)
from fp8rl.rl.calibration import CalibrationResult
from fp8rl.rl.shadow import observe_shadow, refit_metrics, shadow_diagnostics, shadow_phase
from helpers_rl import shadow_case

BOUNDS = (0.8, 1.2)
NOISE = ("shadow/logprob_err_sd", "shadow/old_new_err_corr")


def test_diagnostics_are_the_shadow_metrics_and_the_noise_of_the_hand_example():
    rows = ShadowRows(*shadow_case())
    out = shadow_diagnostics(rows, bounds=BOUNDS, nominal=BOUNDS)
    base = shadow_metrics(rows, bounds=BOUNDS, nominal=BOUNDS)
    assert set(out) == set(base) | set(NOISE)  # no entropies: no high-entropy share
    for k, v in base.items():
        torch.testing.assert_close(out[k], v, rtol=0, atol=0)
    # from the hand example below: t0, t1, t2 clip in FP8, t1 alone in BF16
    assert float(out["shadow/clipfrac_fp8"]) == pytest.approx(3 / 5)
    assert float(out["shadow/false_lower_clip"]) == pytest.approx(1 / 3)
    # S and C by hand over the 5 unmasked tokens: errors FP8 - BF16 of the old pass
    # (log q - log .5) and of the new one (log p - log phat)
    q, p, phat = (
        [0.5, 0.5, 0.4, 0.5, 0.5],
        [0.35, 0.35, 0.5, 0.5, 0.41],
        [0.45, 0.35, 0.5, 0.5, 0.42],
    )
    e_old = [math.log(x / 0.5) for x in q]
    e_new = [math.log(a / b) for a, b in zip(p, phat, strict=True)]
    s2 = (statistics.variance(e_old) + statistics.variance(e_new)) / 2
    assert float(out[NOISE[0]]) == pytest.approx(math.sqrt(s2), rel=1e-12)
    assert float(out[NOISE[1]]) == pytest.approx(statistics.covariance(e_old, e_new) / s2)


@pytest.mark.parametrize("high_row, share", [(0, 1.0), (1, 0.0)])
def test_entropies_add_the_high_entropy_share_of_the_lower_clips(high_row, share):
    # the hand example as 2 responses of 3 tokens: both FP8 lower clips (t0, t1) sit in row 0
    rows = [x.view(2, 3) for x in shadow_case()]
    entropy = torch.full((2, 3), 0.5, dtype=torch.float64)
    entropy[high_row] = 2.0  # the top 10 % of 2 responses: the one of highest mean entropy
    out = shadow_diagnostics(ShadowRows(*rows, entropy=entropy), bounds=BOUNDS, nominal=BOUNDS)
    assert float(out["shadow/high_entropy_lower_clip_share"]) == share


def test_the_fp8_side_clips_at_the_bounds_in_use_and_the_bf16_side_at_nominal():
    out = shadow_diagnostics(ShadowRows(*shadow_case()), bounds=(0.65, 1.3), nominal=BOUNDS)
    # FP8 ratios .7, .7, 1.25, 1, .82 stay inside (.65, 1.3); BF16 clips t1 (.7 < .8)
    assert float(out["shadow/clipfrac_fp8"]) == 0
    assert float(out["shadow/clipfrac_bf16"]) == pytest.approx(1 / 5)


def test_refit_metrics_name_the_new_bounds_as_the_next_steps():
    result = CalibrationResult(
        lower=0.75, upper=1.3, alpha=0.1, rho_ref=1.0, rho=1.1, lower_target=0.7,
        upper_target=1.35, updated=True, n_neg=40, n_pos=50, k=4, pool_steps=2,
    )  # fmt: skip
    out = refit_metrics(result)
    assert (out["calib/next_lower"], out["calib/next_upper"]) == (0.75, 1.3)
    assert "calib/lower" not in out and "calib/upper" not in out  # they stay the bounds in use
    renamed = {"calib/lower": "calib/next_lower", "calib/upper": "calib/next_upper"}
    assert {renamed.get(k, k): v for k, v in result.metrics().items()} == out
    assert out["calib/alpha"] == 0.1 and out["calib/updated"] == 1.0 and out["calib/k"] == 4


def noisy_tokens(n=400, seed=0):
    """FP8 log-probs that stray from their BF16 shadows more than BF16 strays from old."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    lp_shadow = old + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    lp = lp_shadow + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return lp, old, lp_shadow, old, adv, torch.ones(n, dtype=torch.bool)


def test_observe_refits_as_calibrate_bounds_does_and_returns_the_next_bounds():
    lp, old, lp_shadow, old_shadow, adv, mask = noisy_tokens()
    state = CalibrationState(0.8, 1.2, interval=2, rule="paper", min_tokens=4)
    r, r_shadow = ratio(lp, old), ratio(lp_shadow, old_shadow)
    assert observe_shadow(state, 1, r, r_shadow, adv, mask) == {}  # paper: refits at 0, 2, ...
    out = observe_shadow(state, 2, r, r_shadow, adv, mask)
    want = calibrate_bounds(
        r, r_shadow, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), rule="paper",
        max_step=state.max_step, min_tokens=4, lower_min=state.lower_min,
    )  # fmt: skip
    assert want.updated and (want.lower, want.upper) != (0.8, 1.2)
    assert (out["calib/next_lower"], out["calib/next_upper"]) == (want.lower, want.upper)
    assert state.bounds == (want.lower, want.upper)  # adopted from the next step on


def test_the_phase_feeds_only_a_state_that_refits_and_keeps_the_diagnostics():
    tokens = ShadowRows(*noisy_tokens())
    kw = dict(step=2, bounds=(0.8, 1.2))
    alone = CalibrationState(0.8, 1.2, interval=2, rule="paper", min_tokens=4, refits=False)
    out = shadow_phase(tokens, state=alone, **kw)
    assert alone.history == [] and alone.bounds == (0.8, 1.2)
    diag = shadow_diagnostics(tokens, bounds=(0.8, 1.2), nominal=(0.8, 1.2))
    assert out.keys() == diag.keys()
    fed = CalibrationState(0.8, 1.2, interval=2, rule="paper", min_tokens=4)
    both = shadow_phase(tokens, state=fed, **kw)
    assert [h["step"] for h in fed.history] == [2]
    assert both["calib/next_lower"] == fed.lower and both["calib/next_upper"] == fed.upper
    for k, v in diag.items():
        torch.testing.assert_close(both[k], v, rtol=0, atol=0, equal_nan=True)


# ---- the statistics the phase composes, by hand


def test_shadow_metrics_hand_example():
    m = shadow_metrics(ShadowRows(*shadow_case()), bounds=(0.8, 1.2), nominal=(0.8, 1.2))
    expected = {
        # sum|p - phat| = .10 + .01; sum phat = 2.22
        "shadow/nmae_prob": 0.11 / 2.22,
        # sum|r - rhat| = .2 + .25 + .02; sum rhat = 4.44
        "shadow/nmae_ratio": 0.47 / 4.44,
        # unweighted relative errors: |r/rhat - 1| = 2/9, 0, .25, 0, .02/.84 over
        # |p/phat - 1| = 2/9 (.1/.45), 0, 0, 0, .01/.42
        "shadow/amplification": (2 / 9 + 0.25 + 0.02 / 0.84) / (2 / 9 + 0.01 / 0.42),
        "shadow/nmae_quotient": (0.47 / 4.44) / (0.11 / 2.22),
        "shadow/clipfrac_fp8": 3 / 5,
        "shadow/clipfrac_bf16": 1 / 5,
        "shadow/clipfrac_ratio": 3.0,
        # lower clips of negative tokens over all 5: t0, t1 in FP8; t1 in BF16
        "shadow/clipfrac_lower_neg_fp8": 2 / 5,
        "shadow/clipfrac_lower_neg_bf16": 1 / 5,
        # N = {t0, t1, t4}
        "shadow/lower_clipfrac_neg_fp8": 2 / 3,
        "shadow/lower_clipfrac_neg_bf16": 1 / 3,
        "shadow/false_lower_clip": 1 / 3,
        "shadow/lower_clip_excess": 2 / 3 - 1 / 3,
        "shadow/ratio_dev_fp8": (0.3 + 0.3 + 0.25 + 0 + 0.18) / 5,
        "shadow/ratio_dev_bf16": (0.1 + 0.3 + 0 + 0 + 0.16) / 5,
        # e = log(r / rhat): log(7/9), 0, log 1.25, 0, log(.82/.84); sample sd (ddof 1)
        "shadow/logratio_err_sd": statistics.stdev(
            [math.log(7 / 9), 0.0, math.log(1.25), 0.0, math.log(0.82 / 0.84)]
        ),
        # |e| > 0.223 (-log 0.8): log(9/7) = .251 and log 1.25 = .2231
        "shadow/logratio_err_tail": 2 / 5,
    }
    assert set(m) == set(expected)
    for k, v in expected.items():
        assert m[k].item() == pytest.approx(v, rel=1e-12), k


def test_shadow_metrics_use_the_bounds_in_use_for_fp8_and_nominal_for_bf16():
    # Bounds (.75, 1.3): t0 (.7) and t1 still clip low, t2 (1.25) no longer clips high.
    m = shadow_metrics(ShadowRows(*shadow_case()), bounds=(0.75, 1.3), nominal=(0.8, 1.2))
    assert m["shadow/clipfrac_fp8"].item() == pytest.approx(2 / 5)
    assert m["shadow/clipfrac_bf16"].item() == pytest.approx(1 / 5)
    assert m["shadow/false_lower_clip"].item() == pytest.approx(1 / 3)


def test_shadow_metrics_pool_rows_and_flat_vectors_alike():
    lp, old, lp_shadow, old_shadow, adv, mask = shadow_case()
    flat = shadow_metrics(
        ShadowRows(lp, old, lp_shadow, old_shadow, adv, mask), bounds=(0.8, 1.2), nominal=(0.8, 1.2)
    )
    # The same six tokens as two rows of three, with per-token advantages.
    rows = shadow_metrics(
        ShadowRows(*(x.view(2, 3) for x in (lp, old, lp_shadow, old_shadow, adv, mask))),
        bounds=(0.8, 1.2),
        nominal=(0.8, 1.2),
    )
    assert flat and rows.keys() == flat.keys()
    for k in flat:
        assert rows[k].item() == pytest.approx(flat[k].item(), rel=1e-12), k


def entropy_case():
    # 10 responses of 2 tokens, mean entropy of row i = i; an 11th, empty row has entropy 99.
    B, T = 11, 2
    entropy = torch.arange(B, dtype=torch.float32)[:, None].expand(B, T).clone()
    entropy[10] = 99.0
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[10] = False
    ratio = torch.ones(B, T)
    adv = -torch.ones(B)
    # Lower clips (A < 0, r < .8): both tokens of row 9, one of row 8, one of row 0.
    ratio[9] = 0.5
    ratio[8, 0] = 0.5
    ratio[0, 1] = 0.5
    ratio[10] = 0.1  # empty row: not a clip
    return ratio, adv, mask, entropy


def test_high_entropy_share_hand_example():
    ratio, adv, mask, entropy = entropy_case()
    # Top 10 % of 10 responses = row 9: 2 of the 4 lower clips.
    assert high_entropy_lower_clip_share(ratio, adv, mask, entropy, 0.8).item() == pytest.approx(
        0.5
    )
    # Top 20 % = rows 8 and 9: 3 of 4.
    assert high_entropy_lower_clip_share(
        ratio, adv, mask, entropy, 0.8, top_fraction=0.2
    ).item() == pytest.approx(0.75)
    # No lower clip at all: undefined.
    assert math.isnan(high_entropy_lower_clip_share(ratio, adv, mask, entropy, 0.05).item())


def test_high_entropy_share_needs_rows():
    with pytest.raises(ValueError, match="responses are rows"):
        high_entropy_lower_clip_share(
            torch.ones(4), torch.ones(4), torch.ones(4), torch.ones(4), 0.8
        )
