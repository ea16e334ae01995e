"""Calibrated Clipping, the `paper` rule (Algorithm 1) and the shared machinery: hand-derived
examples, hypothesis properties, the FP8 failure mode on synthetic data, CalibrationState.
The `pooled` rule's own properties and the pool are in test_rl_calibration_pooled.py."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fp8rl.rl import (
    BoundSource,
    CalibrationMode,
    CalibrationResult,
    CalibrationState,
    ShadowRows,
    calibrate_bounds,
    shadow_metrics,
)
from fp8rl.rl.calibration import LOWER_CEIL, UPPER_FLOOR
from helpers_rl import WIDE, batches, hand_case, neg_mass, pos_mass

F64 = torch.float64
PAPER = dict(rule="paper")
# the two fits; `direct-first` fits as `pooled` (tests/test_rl_calibration_rules.py)
BOTH = pytest.mark.parametrize("rule", ["pooled", "paper"])
PROPS = settings(max_examples=40, deadline=None)


def test_algorithm_1_hand_example():
    res = calibrate_bounds(
        *hand_case(), nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, **PAPER
    )
    # alpha: rhat < .8 on N is {.75}: 1/5.
    assert res.alpha == pytest.approx(0.2)
    # L*: rank .2 * 4 = .8 between sorted r .6 and .7: .6 + .8 * .1 = .68 (clips {.6}: 1/5).
    assert res.lower_target == pytest.approx(0.68)
    # rho_ref = pos(rhat; 1.2) / neg(rhat; .8) = (.95 + 1.05 + 1.15) / (.85 + .95 + 1 + 1.05)
    #         = 3.15 / 3.85
    assert res.rho_ref == pytest.approx(3.15 / 3.85)
    # target = rho_ref * neg(r; .68) = 3.15 / 3.85 * 3.7 = 3.027; cumulative pos over sorted
    # r_P: .9, 2.0, 3.3 -> reached when 1.3 is included: H* = 1.3, rho there 3.3 / 3.7.
    assert res.upper_target == pytest.approx(1.3)
    assert res.rho_target == pytest.approx(3.3 / 3.7)
    # Caps (.05, .1) from (.8, 1.2): L_t = clamp(.68, .75, .85) = .75;
    # H_t = clamp(1.3, 1.1, 1.3) = 1.3.
    assert res.lower == pytest.approx(0.75)
    assert res.upper == pytest.approx(1.3)
    # With L_t = .75, .7 is clipped too: neg = .9 + 1 + 1.1 = 3.0, rho = 3.3 / 3.0; clips 2 of 5.
    assert res.rho == pytest.approx(1.1)
    assert res.lower_clipfrac == pytest.approx(0.4)
    assert res.updated and res.reason == ""
    assert (res.n_neg, res.n_pos) == (5, 4)
    m = res.metrics()
    assert (
        m["calib/lower"] == res.lower
        and m["calib/alpha"] == res.alpha
        and m["calib/rho"] == res.rho
    )


def test_hand_example_without_caps_and_the_degenerate_upper_targets():
    res = calibrate_bounds(
        *hand_case(), nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, **WIDE, **PAPER
    )
    assert (res.lower, res.upper) == pytest.approx((0.68, 1.3))
    # Every P token above h0 in BF16: pos(rhat; h0) = 0, rho_ref = 0, the target 0 is met
    # by H = 1 already: H* = 1, floored to 1 + 1e-6 so that H > 1.
    r, rh, adv, mask = hand_case()
    rh[5:] = 5.0
    res = calibrate_bounds(
        r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, **WIDE, **PAPER
    )
    assert res.rho_ref == 0.0 and res.upper_target == pytest.approx(UPPER_FLOOR)
    # FP8 ratios of P far below BF16's: all of pos(r; inf) = .4 < target 3.15 / 3.85 * 3.7,
    # no H reaches it: H* = H_max = 1 + 4 * .2 = 1.8 (capped to 1.3 from 1.2).
    r, rh, adv, mask = hand_case()
    r[5:] = 0.1
    res = calibrate_bounds(
        r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, **PAPER
    )
    assert res.upper_target == pytest.approx(1.8) and res.upper == pytest.approx(1.3)


@BOTH
def test_too_few_tokens_keeps_the_previous_bounds(rule):
    res = calibrate_bounds(*hand_case(), nominal=(0.8, 1.2), previous=(0.7, 1.3), rule=rule)
    assert not res.updated
    assert (res.lower, res.upper) == (0.7, 1.3)
    assert "too few tokens: |N|=5, |P|=4, min_tokens=32" in res.reason
    assert math.isnan(res.lower_target) and math.isnan(res.upper_target)
    assert res.alpha == pytest.approx(0.2) and res.k == 1  # still reported


@BOTH
def test_all_negative_tokens_clipped_in_bf16_keeps_the_previous_bounds(rule):
    r, rh, adv, mask = hand_case()
    rh[:5] = 0.5
    res = calibrate_bounds(
        r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, rule=rule
    )
    assert not res.updated and "rho_ref undefined" in res.reason and res.alpha == 1.0


@pytest.mark.parametrize("which", ["ratio", "ratio_shadow", "advantages"])
def test_nan_at_a_masked_in_token_is_an_error(which):
    args = dict(zip(("ratio", "ratio_shadow", "advantages", "mask"), hand_case(), strict=True))
    args[which] = args[which].clone()
    args[which][3] = float("nan")
    with pytest.raises(ValueError, match=f"{which} has 1 NaN/inf"):
        calibrate_bounds(**args, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nominal": (1.1, 1.2)}, r"nominal\[0\] \(lower\) = 1.1"),
        ({"previous": (0.8, 0.9)}, r"previous\[1\] \(upper\) = 0.9"),
        ({"max_step": (-0.1, 0.1)}, r"max_step\[0\] = -0.1"),
        ({"min_tokens": 0}, "min_tokens must be a positive int"),
        ({"upper_max": 0.5}, "upper_max = 0.5"),
        ({"lower_min": 1.0}, "lower_min = 1.0"),
        ({"rule": "median"}, "unknown calibration rule 'median'; valid: pooled, paper"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    args = dict(nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate_bounds(*hand_case(), **args)


# ---- properties -------------------------------------------------------------------------


@BOTH
@PROPS
@given(batch=batches())
def test_equal_ratios_give_back_the_tokens_the_nominal_bounds_clip(batch, rule):
    _, rh, adv, mask, (l0, h0) = batch
    res = calibrate_bounds(
        rh, rh, adv, mask, nominal=(l0, h0), previous=(l0, h0), rule=rule, **WIDE
    )
    assume(res.updated)
    neg, pos = mask & (adv < 0), mask & (adv > 0)
    assert torch.equal(neg & (rh < res.lower), neg & (rh < l0))
    assert torch.equal(pos & (rh > res.upper), pos & (rh > h0))


@BOTH
@PROPS
@given(batch=batches(ties=False))
def test_fp8_lower_clip_fraction_lands_within_one_token_of_alpha(batch, rule):
    r, rh, adv, mask, (l0, h0) = batch
    res = calibrate_bounds(r, rh, adv, mask, nominal=(l0, h0), previous=(l0, h0), rule=rule, **WIDE)
    assume(res.updated and 0.05 < res.lower_target < LOWER_CEIL)  # L* not clamped
    neg = mask & (adv < 0)
    n_neg = int(neg.sum())
    frac = float((neg & (r < res.lower)).sum()) / n_neg
    assert abs(frac - res.alpha) <= 1 / n_neg + 1e-12
    assert res.lower_clipfrac == pytest.approx(frac)


@PROPS
@given(batches())
def test_upper_bound_is_the_first_step_that_reaches_rho_ref(batch):
    r, rh, adv, mask, (l0, h0) = batch
    res = calibrate_bounds(r, rh, adv, mask, nominal=(l0, h0), previous=(l0, h0), **WIDE, **PAPER)
    assume(res.updated)
    # Re-derived in float64 with plain sums: rho_ref and the target at L*.
    rho_ref = pos_mass(rh, adv, mask, h0) / neg_mass(rh, adv, mask, l0)
    assert res.rho_ref == pytest.approx(rho_ref, rel=1e-12)
    target = rho_ref * neg_mass(r, adv, mask, res.lower_target)
    tol = 1e-8 * pos_mass(r, adv, mask, math.inf)
    if res.upper_target == 100.0:  # H_max: even all of P falls short
        assert pos_mass(r, adv, mask, math.inf) < target + tol
        return
    # H* reaches the target ...
    assert pos_mass(r, adv, mask, res.upper_target) >= target - tol
    assert res.rho_target >= rho_ref * (1 - 1e-8)
    # ... and every smaller admissible H (>= 1) does not: one token less falls short.
    if res.upper_target > UPPER_FLOOR:
        assert pos_mass(r, adv, mask, res.upper_target, strict=True) < target + tol


@BOTH
@PROPS
@given(
    batch=batches(),
    l_prev=st.floats(0.5, 0.95),
    h_prev=st.floats(1.05, 2.0),
    caps=st.tuples(st.floats(0.0, 0.2), st.floats(0.0, 0.4)),
    wild=st.booleans(),
)
def test_bounds_stay_around_one_and_move_at_most_their_cap(batch, l_prev, h_prev, caps, wild, rule):
    r, rh, adv, mask, nominal = batch
    if wild:  # ratios far from 1 push L*, H* into their clamps
        r = r**8
    res = calibrate_bounds(
        r, rh, adv, mask, nominal=nominal, previous=(l_prev, h_prev), max_step=caps, rule=rule
    )
    assert res.lower < 1 < res.upper
    assert abs(res.lower - l_prev) <= caps[0] + 1e-12
    h_max = 1 + 4 * (nominal[1] - 1)
    if (
        res.updated and rule == "pooled" and h_prev > h_max
    ):  # a previous bound outside (1, H_max] is brought in
        assert res.upper <= h_max + 1e-12
    else:
        assert abs(res.upper - h_prev) <= caps[1] + 1e-12
    if res.updated:
        assert 0.05 <= res.lower_target < 1 < res.upper_target <= 1 + 4 * (nominal[1] - 1) + 1e-12


@BOTH
@PROPS
@given(batch=batches(), seed=st.integers(0, 2**32 - 1))
def test_masked_tokens_never_matter(batch, seed, rule):
    r, rh, adv, mask, nominal = batch
    kw = dict(nominal=nominal, previous=nominal, rule=rule)
    compact = calibrate_bounds(
        r[mask], rh[mask], adv[mask], torch.ones(int(mask.sum()), dtype=torch.bool), **kw
    )
    rng = np.random.default_rng(seed)
    junk = torch.tensor(
        rng.choice([np.nan, np.inf, -np.inf, -5.0, 1e9, 0.0], size=(3, len(r))), dtype=F64
    )
    r2, rh2, adv2 = (torch.where(mask, x, j) for x, j in zip((r, rh, adv), junk, strict=True))
    dirty = calibrate_bounds(r2, rh2, adv2, mask, **kw)
    assert dirty.as_dict() == compact.as_dict()


@BOTH
@PROPS
@given(batch=batches())
def test_deterministic_and_layout_free(batch, rule):
    r, rh, adv, mask, nominal = batch
    kw = dict(nominal=nominal, previous=nominal, rule=rule)
    first = calibrate_bounds(r, rh, adv, mask, **kw)
    assert calibrate_bounds(r, rh, adv, mask, **kw) == first or not first.updated
    n = len(r) - len(r) % 5
    rows = calibrate_bounds(*(x[:n].view(5, -1) for x in (r, rh, adv, mask)), **kw)
    flat = calibrate_bounds(r[:n], rh[:n], adv[:n], mask[:n], **kw)
    assert rows.as_dict() == flat.as_dict()


def test_per_sequence_advantages_broadcast_over_tokens():
    g = torch.Generator().manual_seed(0)
    r = torch.exp(0.1 * torch.randn(8, 30, generator=g, dtype=F64))
    seq_adv = torch.tensor([1.0, -1, 2, -2, 0.5, -0.5, 1, -1], dtype=F64)
    mask = torch.ones(8, 30, dtype=torch.bool)
    a = calibrate_bounds(r, r, seq_adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2))
    b = calibrate_bounds(
        r, r, seq_adv[:, None].expand(8, 30), mask, nominal=(0.8, 1.2), previous=(0.8, 1.2)
    )
    assert a.updated and a == b


# ---- the paper's failure mode on synthetic data ------------------------------------------


@BOTH
def test_fp8_noise_inflates_lower_clips_and_calibration_brings_them_back(rule):
    g = torch.Generator().manual_seed(1234)
    n_resp, T = 256, 64
    # Reference (BF16) batch: log-probs of sampled tokens, a small policy update, and
    # one advantage per response.
    old_shadow = torch.log(torch.rand(n_resp, T, generator=g, dtype=F64).clamp_min(0.02))
    new_shadow = old_shadow + 0.08 * torch.randn(n_resp, T, generator=g, dtype=F64)
    adv = torch.randn(n_resp, generator=g, dtype=F64)
    mask = torch.ones(n_resp, T, dtype=torch.bool)
    # FP8: multiplicative noise on each log-prob, independent between the old and the new
    # pass (the weights differ after the first mini-batch update).
    sigma = 0.04
    old_fp8 = old_shadow * (1 + sigma * torch.randn(n_resp, T, generator=g, dtype=F64))
    new_fp8 = new_shadow * (1 + sigma * torch.randn(n_resp, T, generator=g, dtype=F64))
    r, rh = torch.exp(new_fp8 - old_fp8), torch.exp(new_shadow - old_shadow)
    nominal = (0.8, 1.28)
    neg = adv[:, None].expand_as(r) < 0

    def lower_frac(x, lower):
        return float((neg & (x < lower)).sum() / neg.sum())

    ref_frac = lower_frac(rh, nominal[0])
    fp8_frac = lower_frac(r, nominal[0])
    assert 0 < ref_frac < 0.01
    assert (
        fp8_frac > 4 * ref_frac
    )  # the failure mode: many more negative tokens lose their gradient

    rows = ShadowRows(new_fp8, old_fp8, new_shadow, old_shadow, adv, mask)
    shadow = shadow_metrics(rows, bounds=nominal, nominal=nominal)
    assert shadow["shadow/false_lower_clip"].item() > 3 * ref_frac
    assert shadow["shadow/amplification"].item() > 1.0

    # One calibration moves the lower bound by its cap and already cuts the excess ...
    state = CalibrationState(*nominal, rule=rule)
    first = state.calibrate(r, rh, adv, mask, step=0)
    assert first.lower == pytest.approx(nominal[0] - 0.05)
    assert lower_frac(r, first.lower) < fp8_frac
    # ... and a few more land on the quantile-matched bound: FP8 now clips what BF16 clipped.
    for step in (20, 40, 60):
        state.calibrate(r, rh, adv, mask, step=step)
    n_neg = int(neg.sum())
    assert state.lower == pytest.approx(state.history[-1]["lower_target"])
    assert abs(lower_frac(r, state.lower) - ref_frac) <= 1 / n_neg + 1e-9
    assert state.history[-1]["rho"] == pytest.approx(state.history[-1]["rho_ref"], rel=0.02)
    after = shadow_metrics(rows, bounds=state.bounds, nominal=nominal)
    # (pooled clips k - 1 of the tokens it was fitted on, paper k: within one token either way)
    assert after["shadow/lower_clipfrac_neg_fp8"].item() == pytest.approx(
        ref_frac, abs=1 / n_neg + 1e-9
    )


# ---- CalibrationState ---------------------------------------------------------------------


def test_calibration_steps_start_at_zero_and_repeat_every_interval():
    state = CalibrationState(0.8, 1.2, interval=20)
    assert [s for s in range(61) if state.is_shadow_step(s)] == [0, 20, 40, 60]
    assert not state.is_shadow_step(-20)


def test_state_update_modes_and_json_round_trip():
    res = calibrate_bounds(
        *hand_case(), nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, **PAPER
    )
    diag = CalibrationState(0.8, 1.2, mode="diagnose")
    diag.update(res, step=0)
    assert diag.bounds == (0.8, 1.2) and diag.history[0]["lower"] == res.lower

    state = CalibrationState(0.8, 1.2, min_tokens=2, rule="paper")
    state.update(res, step=0)
    assert state.bounds == (res.lower, res.upper)
    kept = calibrate_bounds(*hand_case(), nominal=(0.8, 1.2), previous=state.bounds, **PAPER)
    state.update(kept, step=20)
    assert state.bounds == (res.lower, res.upper)  # not updated: the bounds stay

    text = json.dumps(state.state_dict(), allow_nan=False)  # strict JSON: NaN became null
    restored = CalibrationState(0.5, 1.5)
    restored.load_state_dict(json.loads(text))
    assert restored.state_dict() == state.state_dict()
    assert restored.nominal == (0.8, 1.2) and restored.history[1]["step"] == 20
    back = CalibrationResult.from_dict(
        {k: v for k, v in restored.history[1].items() if k not in ("step", "mode")}
    )
    assert back.reason == kept.reason and math.isnan(back.lower_target)


def test_the_mode_is_one_word_and_checkpoints_keep_plain_strings():
    state = CalibrationState(0.8, 1.2, mode="diagnose", min_tokens=2, rule="paper")
    assert state.mode is CalibrationMode.DIAGNOSE and not state.moves_bounds
    assert CalibrationState(0.8, 1.2).moves_bounds
    state.update(calibrate_bounds(*hand_case(), nominal=(0.8, 1.2), previous=(0.8, 1.2), **PAPER))
    saved = state.state_dict()
    # the checkpoint format of before the enum: type(...) is str, not a str subclass
    assert type(saved["mode"]) is str and type(saved["history"][0]["mode"]) is str
    assert json.loads(json.dumps(saved))["mode"] == "diagnose"
    restored = CalibrationState(0.5, 1.5)
    restored.load_state_dict(json.loads(json.dumps(saved)))
    assert restored.mode is CalibrationMode.DIAGNOSE


@pytest.mark.parametrize(
    "source, mode",
    [("calibrated", "calibrate"), ("nominal", "diagnose"), (BoundSource.RELAXED, "diagnose")],
)
def test_from_config_takes_every_setting_of_the_section_and_the_mode_from_the_source(source, mode):
    from fp8rl.config import CalibrationConfig

    section = CalibrationConfig(
        rule="paper",
        interval=6,
        shadow_every=3,
        pool_window=4,
        pool_min_clips=7,
        pool_max_tokens=1000,
        max_step_lower=0.03,
        max_step_upper=0.07,
        min_tokens=9,
        lower_min=0.1,
        upper_max=2.5,
    )
    state = CalibrationState.from_config(section, eps=(0.2, 0.28), source=source, seed=5)
    nominal = (1 - 0.2, 1 + 0.28)
    expected = CalibrationState(
        lower=nominal[0],
        upper=nominal[1],
        nominal=nominal,
        interval=6,
        mode=mode,
        rule="paper",
        shadow_every=3,
        pool_window=4,
        pool_min_clips=7,
        pool_max_tokens=1000,
        max_step=(0.03, 0.07),
        min_tokens=9,
        lower_min=0.1,
        upper_max=2.5,
        seed=5,
    )
    assert state.state_dict() == expected.state_dict()
    assert state.moves_bounds is state.refits is (mode == "calibrate")


@pytest.mark.parametrize(
    "source, expected",
    [("nominal", (0.8, 1.28)), ("relaxed", (0.6, 1.28)), ("calibrated", (0.7, 1.4))],
)
def test_the_state_owns_the_clip_bounds_of_every_bound_source(source, expected):
    from fp8rl.config import CalibrationConfig

    state = CalibrationState.from_config(
        CalibrationConfig(), eps=(0.2, 0.28), source=source, relaxed_lower=0.6
    )
    assert state.clip_bounds == (
        (0.6, 1 + 0.28) if source == "relaxed" else state.nominal
    )  # before a refit
    state.lower, state.upper = 0.7, 1.4  # as a refit leaves them (recorded only, if diagnose)
    assert state.clip_bounds == pytest.approx(expected)


def test_the_state_owns_the_shadow_cadence_and_a_checkpoint_keeps_the_run_s():
    from fp8rl.config import CalibrationConfig

    section = CalibrationConfig(interval=4, shadow_every=2)
    off = CalibrationState.from_config(section, eps=(0.2, 0.2), source="nominal")
    off.shadow_passes = False
    assert not any(off.is_shadow_step(s) for s in range(9))
    on = CalibrationState.from_config(section, eps=(0.2, 0.2), source="relaxed", relaxed_lower=0.6)
    assert [s for s in range(9) if on.is_shadow_step(s)] == [0, 2, 4, 6, 8]
    saved = on.state_dict()
    assert not {"shadow_passes", "refits", "relaxed_lower"} & set(saved)  # the plan's, not state
    off.load_state_dict(saved)
    assert not off.shadow_passes and off.relaxed_lower is None and off.shadow_every == 2


def test_state_rejects_bad_values():
    with pytest.raises(
        ValueError, match="unknown calibration mode 'off'; valid: calibrate, diagnose"
    ):
        CalibrationState(0.8, 1.2, mode="off")
    with pytest.raises(ValueError, match="interval must be a positive int, got 0"):
        CalibrationState(0.8, 1.2, interval=0)
    with pytest.raises(ValueError, match=r"bounds \(lower, upper\)\[0\] \(lower\) = 1.2"):
        CalibrationState(1.2, 1.3)
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]"):
        CalibrationState(0.8, 1.2).load_state_dict(
            {"lower": 0.8, "upper": 1.2, "nominal": [0.8, 1.2], "bogus": 1}
        )
