"""The rule table (rl.calibration.RULES): the names the config accepts, the `direct-first`
row, whose first refit goes straight to its targets while `pooled`'s is capped, and the
`noise-scaled` row, whose caps scale with the measured noise. The fits themselves are tested
in test_rl_calibration.py (paper) and test_rl_calibration_pooled.py."""

import json

import numpy as np
import pytest
import torch

from fp8rl.config import config_from_dict
from fp8rl.config.sections import CalibrationConfig
from fp8rl.errors import ConfigError
from fp8rl.rl import CalibrationState, calibrate_bounds
from fp8rl.rl.calibration import NOISE_REFERENCE_SD, RULES, check_rule
from helpers_config import tiny_config

F64 = torch.float64
CAPS = (0.05, 0.1)
L_STAR = 0.30 + 0.01 * 4  # the 5th smallest FP8 ratio of _far_step's N, as float64 has it
H_MAX = 1 + 4 * (1.2 - 1)


def _far_step():
    """Nominal (0.8, 1.2). BF16 clips 5 of 100 negative tokens (rhat 0.7); FP8's ratios of N
    are 0.30, 0.31, ..., 1.29, so FP8 clips 50 at 0.8 and L* is the 5th smallest, 0.34.
    Every positive FP8 ratio is 0.5: their mass 20 never reaches rho_ref neg(r; L) (rho_ref =
    40 / 95, neg(r; 0.34) = 78.24), so H* = H_max = 1 + 4 x 0.2 = 1.8."""
    r_n = 0.30 + 0.01 * torch.arange(100, dtype=F64)
    rh_n = torch.cat([torch.full((5,), 0.7, dtype=F64), torch.ones(95, dtype=F64)])
    r = torch.cat([r_n, torch.full((40,), 0.5, dtype=F64)])
    rh = torch.cat([rh_n, torch.ones(40, dtype=F64)])
    adv = torch.cat([-torch.ones(100, dtype=F64), torch.ones(40, dtype=F64)])
    return r, rh, adv, torch.ones(140, dtype=torch.bool)


def _nominal_step():
    """FP8 == BF16 (5 of 100 clipped at 0.8, positives at 1.0): the targets are (0.8, 1.2)."""
    rh = torch.cat([torch.full((5,), 0.7, dtype=F64), torch.ones(135, dtype=F64)])
    adv = torch.cat([-torch.ones(100, dtype=F64), torch.ones(40, dtype=F64)])
    return rh.clone(), rh, adv, torch.ones(140, dtype=torch.bool)


def _state(rule, **kw):
    # pool_window 1: each refit fits on its own step, so every target is the hand-derived one
    return CalibrationState(0.8, 1.2, interval=1, rule=rule, pool_window=1, max_step=CAPS, **kw)


def test_the_table_holds_exactly_the_rules_the_config_accepts():
    assert list(RULES) == ["pooled", "paper", "direct-first", "noise-scaled"]
    for name, row in RULES.items():
        assert row.name == name and check_rule(name) == name
        CalibrationConfig(rule=name).check()
    with pytest.raises(ConfigError) as err:
        CalibrationConfig(rule="direct").check()
    msg = str(err.value)
    assert "calibration.rule" in msg and "\n" not in msg
    assert all(repr(name) in msg for name in RULES)
    for bad in ("direct", ["pooled"], None):
        with pytest.raises(ValueError, match="unknown calibration rule"):
            check_rule(bad)
    assert CalibrationConfig().rule == "pooled"  # the default stays pooled (issue 45 item 4)


def test_first_refit_steps_follow_the_rows():
    assert [RULES[n].first_refit_step(20) for n in RULES] == [20, 0, 20, 20]
    assert RULES["pooled"].first_refit_step(1) == 1
    cadence = {n: [t for t in range(7) if _state(n).is_refit_step(t)] for n in RULES}
    assert cadence == {n: list(range(7)) if n == "paper" else list(range(1, 7)) for n in RULES}


def test_direct_first_fits_as_pooled():
    args = dict(nominal=(0.8, 1.2), previous=(0.8, 1.2), max_step=CAPS)
    pooled = calibrate_bounds(*_far_step(), rule="pooled", **args)
    direct = calibrate_bounds(*_far_step(), rule="direct-first", **args)
    assert direct.rule == "direct-first"
    assert direct.as_dict() == {**pooled.as_dict(), "rule": "direct-first"}


def test_the_first_refit_lands_on_its_target_for_direct_first_and_is_capped_for_pooled():
    pooled, direct = _state("pooled"), _state("direct-first")
    p, d = pooled.observe(1, *_far_step()), direct.observe(1, *_far_step())
    for res in (p, d):
        assert res.updated and (res.lower_target, res.upper_target) == (L_STAR, H_MAX)
    assert (d.lower, d.upper) == (L_STAR, H_MAX) and direct.bounds == (L_STAR, H_MAX)
    assert (p.lower, p.upper) == (pytest.approx(0.75), pytest.approx(1.3))
    assert pooled.bounds == (p.lower, p.upper)


def test_later_refits_are_capped_in_both_rules():
    states = {n: _state(n) for n in ("pooled", "direct-first")}
    steps = (_far_step, _nominal_step, _far_step, _nominal_step)
    trails = {n: [s.bounds] for n, s in states.items()}
    for t, make in enumerate(steps, start=1):
        for n, s in states.items():
            s.observe(t, *make())
            trails[n].append(s.bounds)
    for n, trail in trails.items():
        later = list(zip(trail[1:], trail[2:], strict=False))
        assert len(later) == 3
        for (l_a, h_a), (l_b, h_b) in later:
            assert abs(l_b - l_a) <= CAPS[0] + 1e-12 and abs(h_b - h_a) <= CAPS[1] + 1e-12, n
    # direct-first after 0.34 / 1.8: towards (0.8, 1.2) by the caps, back to 0.34, up again
    lows = [lo for lo, _ in trails["direct-first"]]
    assert lows == pytest.approx([0.8, 0.34, 0.39, 0.34, 0.39])
    assert [lo for lo, _ in trails["pooled"]] == pytest.approx([0.8, 0.75, 0.8, 0.75, 0.8])
    # H is solved against the capped L: at L = 0.39 the nominal step's negative mass (98.5)
    # x rho_ref (40 / 95) exceeds every positive mass (40), so H* stays at H_max
    assert [h for _, h in trails["direct-first"]] == pytest.approx([1.2] + [H_MAX] * 4)
    assert [h for _, h in trails["pooled"]] == pytest.approx([1.2, 1.3, 1.2, 1.3, 1.2])


def test_a_kept_first_refit_leaves_the_next_one_uncapped():
    s = _state("direct-first")
    r, rh, adv, mask = _far_step()
    few = torch.zeros(140, dtype=torch.bool)
    few[:10] = few[-10:] = True  # 10 N and 10 P tokens: under min_tokens (32)
    kept = s.observe(1, r, rh, adv, few)
    assert not kept.updated and s.bounds == (0.8, 1.2)
    assert s.observe(2, *_far_step()).lower == L_STAR


def test_a_resumed_direct_first_state_keeps_its_rule_and_caps_the_refit_after_the_first():
    full, part = _state("direct-first"), _state("direct-first")
    for s in (full, part):
        s.observe(1, *_far_step())
    saved = json.loads(json.dumps(part.state_dict()))
    assert saved["rule"] == "direct-first"
    resumed = _state("pooled")  # the checkpoint's rule wins
    resumed.load_state_dict(saved)
    resumed.load_pool_tensors(part.pool_tensors())
    assert resumed.rule == "direct-first" and resumed.bounds == (L_STAR, H_MAX)
    a, b = full.observe(2, *_nominal_step()), resumed.observe(2, *_nominal_step())
    assert a.as_dict() == b.as_dict() and b.lower == pytest.approx(0.39)


def _noisy_step(sigma):
    """FP8 = BF16 x exp(+-sigma), the sign alternating over the 140 tokens. BF16: 5 of 100
    negative tokens at 0.7, 95 at 0.81 (none clipped at 0.8), positives at 1.0. FP8 pushes
    the 0.81s to 0.81 e^-sigma: for sigma = 0.02 and 0.05 about half of them fall below 0.8,
    so L* is the 5th smallest FP8 ratio, 0.7 e^sigma (2 of the 5 BF16 clips go up)."""
    rh = torch.cat(
        [
            torch.full((5,), 0.7, dtype=F64),
            torch.full((95,), 0.81, dtype=F64),
            torch.ones(40, dtype=F64),
        ]
    )
    signs = torch.tensor([(-1.0) ** i for i in range(140)], dtype=F64)
    adv = torch.cat([-torch.ones(100, dtype=F64), torch.ones(40, dtype=F64)])
    return rh * torch.exp(sigma * signs), rh, adv, torch.ones(140, dtype=torch.bool)


@pytest.mark.parametrize("sigma", [0.02, 0.05])
def test_noise_scaled_caps_are_the_caps_times_the_measured_sd_over_the_reference(sigma):
    step = _noisy_step(sigma)
    r, rh = step[0].numpy(), step[1].numpy()
    sd = float(np.std(np.log(r) - np.log(rh), ddof=1))  # the reference: float64 numpy
    d_low, d_up = (c * sd / NOISE_REFERENCE_SD for c in CAPS)
    args = dict(nominal=(0.8, 1.2), previous=(0.8, 1.2), max_step=CAPS)
    noisy = calibrate_bounds(*step, rule="noise-scaled", **args)
    pooled = calibrate_bounds(*step, rule="pooled", **args)
    assert noisy.lower_target == pooled.lower_target == pytest.approx(0.7 * np.exp(sigma))
    # (H* is solved against each rule's own capped L, so the upper targets differ)
    assert noisy.lower == pytest.approx(max(noisy.lower_target, 0.8 - d_low), abs=1e-12)
    want_upper = min(max(noisy.upper_target, 1.2 - d_up), 1.2 + d_up)
    assert noisy.upper == pytest.approx(want_upper, abs=1e-12)
    assert pooled.lower == pytest.approx(0.75)  # the fixed cap binds in both cases
    if sigma == 0.02:  # less noise than the reference: a shorter step than pooled's
        assert 0.75 < noisy.lower == pytest.approx(0.8 - d_low, abs=1e-12)
    else:  # more: the step reaches the target pooled's cap holds it from
        assert noisy.lower == noisy.lower_target < 0.75


def test_noise_scaled_keeps_its_bounds_where_fp8_is_bf16():
    r, rh, adv, mask = _noisy_step(0.05)
    res = calibrate_bounds(
        rh, rh, adv, mask, rule="noise-scaled", nominal=(0.8, 1.2), previous=(0.7, 1.3)
    )
    assert (res.lower, res.upper) == (0.7, 1.3)  # sd 0: caps 0, nothing to correct for


def test_noise_scaled_is_refused_for_sequence_ratios(tmp_path):
    data = tiny_config(
        tmp_path / "run", loss={"mode": "gspo_calibrated"}, calibration={"rule": "noise-scaled"}
    )
    with pytest.raises(ConfigError, match="calibration.rule.*noise-scaled.*sequence ratios"):
        config_from_dict(data)
    assert not (tmp_path / "run").exists()
    data["loss"]["mode"] = "calibrated"
    assert config_from_dict(data).calibration.rule == "noise-scaled"
