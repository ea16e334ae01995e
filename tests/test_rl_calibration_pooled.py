"""The `pooled` calibration rule (the default) and the pool CalibrationState keeps: a
hand-derived example, the rule's properties, the held-out clip rate on synthetic data (where
the `paper` rule must fail), and the pool's window, step-0 exclusion, subsampling and
checkpoint round trip."""

import math
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from fp8rl.rl import CalibrationState, calibrate_bounds
from fp8rl.rl.calibration import UPPER_FLOOR
from helpers_rl import WIDE, batches, hand_case, neg_mass, pos_mass

F64 = torch.float64
PROPS = settings(max_examples=40, deadline=None)


def test_pooled_hand_example():
    res = calibrate_bounds(*hand_case(), nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2)
    # N: r = .6 .7 .9 1 1.1, rhat = .75 .85 .95 1 1.05. BF16 clips k = 1 (.75 < .8); FP8 at
    # l0 clips c = 2 (.6, .7) != k, so L* = the k-th smallest FP8 ratio, .6.
    assert (res.k, res.alpha, res.rule) == (1, pytest.approx(0.2), "pooled")
    assert res.lower_target == pytest.approx(0.6)
    # Caps first: L_t = clamp(.6, .75, .85) = .75 (clips .6 and .7).
    assert res.lower == pytest.approx(0.75)
    # H against L_t: target = rho_ref neg(r; .75) = 3.15 / 3.85 * (.9 + 1 + 1.1) = 2.4545;
    # prefix sums over sorted r_P .9, 2.0, 3.3: j = 3, u_3 = 1.3 > h0, so H* = 1.3.
    assert res.upper_target == pytest.approx(1.3) and res.upper == pytest.approx(1.3)
    assert res.rho_target == pytest.approx(3.3 / 3.0) and res.rho == pytest.approx(3.3 / 3.0)
    assert res.lower_clipfrac == pytest.approx(0.4)


def test_pooled_keeps_the_nominal_bounds_where_fp8_already_matches():
    r, rh, adv, mask = hand_case()
    r[:5] = torch.tensor([0.7, 0.85, 0.95, 1.0, 1.05], dtype=F64)  # c = k = 1 at l0 = .8
    # P: FP8 ratios carry exactly the BF16 target mass below h0: H* = h0 by the projection
    r[5:] = rh[5:]
    res = calibrate_bounds(r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2)
    assert (res.lower_target, res.lower) == (0.8, 0.8)
    assert (res.upper_target, res.upper) == (1.2, 1.2)
    # The same numbers, the paper's rule: an interpolated quantile and the largest included ratio
    paper = calibrate_bounds(
        r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, rule="paper"
    )
    assert paper.lower_target != 0.8 and paper.upper_target == pytest.approx(1.15)


def test_alpha_zero_with_every_fp8_ratio_above_l0_gives_l0():
    r, rh, adv, mask = hand_case()
    rh[:5] = torch.tensor([0.9, 0.95, 1.0, 1.05, 1.1], dtype=F64)  # BF16 clips nothing
    r[:5] = torch.tensor([0.82, 0.9, 1.0, 1.0, 1.2], dtype=F64)  # nor does FP8 at l0
    res = calibrate_bounds(r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2)
    assert res.alpha == 0 and res.lower_target == 0.8 and res.lower == 0.8
    # the paper's 0-quantile is the smallest FP8 ratio, tighter than nominal
    paper = calibrate_bounds(
        r, rh, adv, mask, nominal=(0.8, 1.2), previous=(0.8, 1.2), min_tokens=2, rule="paper"
    )
    assert paper.lower_target == pytest.approx(0.82)


@PROPS
@given(batch=batches(), dl=st.floats(-0.05, 0.05), dh=st.floats(-0.1, 0.1))
def test_equal_ratios_return_the_nominal_bounds_exactly(batch, dl, dh):
    _, rh, adv, mask, (l0, h0) = batch
    assume(0 < l0 + dl < 1 < h0 + dh)  # a valid previous pair (h0 may sit within 0.1 of 1)
    res = calibrate_bounds(rh, rh, adv, mask, nominal=(l0, h0), previous=(l0 + dl, h0 + dh))
    assume(res.updated)
    assert (res.lower, res.upper) == (l0, h0)


@PROPS
@given(batch=batches(), l_prev=st.floats(0.6, 0.95), h_prev=st.floats(1.1, 1.6))
def test_the_upper_bound_is_solved_against_the_lower_bound_the_loss_uses(batch, l_prev, h_prev):
    r, rh, adv, mask, (l0, h0) = batch
    r = r**3  # noisier FP8: the caps on L bind often
    res = calibrate_bounds(r, rh, adv, mask, nominal=(l0, h0), previous=(l_prev, h_prev))
    assume(res.updated)
    h_max = 1 + 4 * (h0 - 1)
    target = res.rho_ref * neg_mass(r, adv, mask, res.lower)  # at L_t, not at L*
    tol = 1e-8 * pos_mass(r, adv, mask, math.inf)
    hs = res.upper_target
    pos = mask & (adv > 0)
    if hs < h_max:
        assert pos_mass(r, adv, mask, hs) >= target - tol
        # the fewest tokens: without the largest ratio it includes, the mass falls short
        # (hs is that ratio, or h0 when h0 includes exactly the same tokens)
        if bool((pos & (r <= hs)).any()) and hs > UPPER_FLOOR:
            u_j = float(r[pos & (r <= hs)].max())
            assert hs == u_j or hs == h0
            assert pos_mass(r, adv, mask, u_j, strict=True) < target + tol
    else:  # H_max: no H reaches the target, or only one beyond H_max
        assert pos_mass(r, adv, mask, h_max, strict=True) < target + tol
    assert res.upper == pytest.approx(min(max(hs, h_prev - 0.1), h_prev + 0.1, h_max))
    assert res.rho_target == pytest.approx(
        pos_mass(r, adv, mask, hs) / neg_mass(r, adv, mask, res.lower)
    )


def _held_out_bias(rule: str, draws: int, seed: int) -> tuple[float, float]:
    """Mean and SE, in units of 1 / (n + 1), of (expected FP8 lower-clip rate of new tokens at
    the fitted L*) - (BF16 rate at l0), over i.i.d. draws of n negative tokens: BF16
    log-ratio sd .08, FP8 adds sd .04, l0 = .85, caps that never bind."""
    n, n_pos, l0, sd_b, sd_f = 300, 64, 0.85, 0.08, 0.04
    sd = math.hypot(sd_b, sd_f)
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    g = torch.Generator().manual_seed(seed)
    adv = torch.cat([-torch.ones(n, dtype=F64), torch.ones(n_pos, dtype=F64)])
    mask = torch.ones(n + n_pos, dtype=torch.bool)
    out = []
    for _ in range(draws):
        log_rh = sd_b * torch.randn(n + n_pos, generator=g, dtype=F64)
        log_r = log_rh + sd_f * torch.randn(n + n_pos, generator=g, dtype=F64)
        res = calibrate_bounds(
            log_r.exp(),
            log_rh.exp(),
            adv,
            mask,
            nominal=(l0, 1.2),
            previous=(l0, 1.2),
            rule=rule,
            **WIDE,
        )
        # new tokens from the same distribution: log r ~ N(0, sd), clipped when r < L*
        out.append((phi(math.log(res.lower) / sd) - phi(math.log(l0) / sd_b)) * (n + 1))
    return statistics.fmean(out), statistics.stdev(out) / math.sqrt(draws)


def test_held_out_lower_clip_rate_matches_bf16_for_pooled_and_not_for_paper():
    pooled, se_pooled = _held_out_bias("pooled", 6000, seed=7)
    paper, se_paper = _held_out_bias("paper", 6000, seed=7)
    assert se_pooled < 0.05 and se_paper < 0.05
    assert abs(pooled) < 0.5  # measured about -0.26 (order statistics, correlated k)
    assert paper > 0.5  # about +0.68: the interpolated quantile clips ~1/(n+1) too many


# ---- the pool -----------------------------------------------------------------------------


def _step_tokens(n_neg, clips, n_pos=40, noise=0.0, seed=0):
    """n_neg negative tokens of which `clips` are clipped in BF16 at l0 = .8, and n_pos
    positive ones; FP8 ratios = BF16 ratios times exp(noise * N(0, 1))."""
    g = torch.Generator().manual_seed(seed)
    rh_n = torch.cat(
        [
            torch.full((clips,), 0.7, dtype=F64),
            0.85 + 0.3 * torch.rand(n_neg - clips, generator=g, dtype=F64),
        ]
    )
    rh_p = 0.9 + 0.4 * torch.rand(n_pos, generator=g, dtype=F64)
    rh = torch.cat([rh_n, rh_p])
    r = rh * torch.exp(noise * torch.randn(rh.shape, generator=g, dtype=F64))
    adv = torch.cat([-torch.ones(n_neg, dtype=F64), torch.ones(n_pos, dtype=F64)])
    return r, rh, adv, torch.ones(rh.shape, dtype=torch.bool)


def state(**kw):
    return CalibrationState(0.8, 1.2, interval=kw.pop("interval", 1), **kw)


def test_step_zero_never_enters_the_pool_and_the_first_refit_is_at_step_one():
    s = state()
    assert s.observe(0, *_step_tokens(100, 50)) is None and len(s.pool) == 0
    res = s.observe(1, *_step_tokens(100, 5, noise=0.05))
    assert res is not None and res.pool_steps == 1 and res.n_neg == 100 and res.k == 5
    assert s.history[-1]["step"] == 1 and s.bounds == (res.lower, res.upper)


def test_the_pool_grows_until_it_holds_pool_min_clips_or_pool_window_steps():
    s = state(pool_min_clips=20, pool_window=3)
    sizes = []
    for step, clips in zip(range(1, 7), (4, 4, 4, 30, 2, 3), strict=True):
        res = s.observe(step, *_step_tokens(100, clips, seed=step))
        sizes.append((res.pool_steps, res.n_neg, res.k))
    assert sizes == [
        (1, 100, 4),
        (2, 200, 8),
        (3, 300, 12),  # the window (3) caps it
        (1, 100, 30),  # step 4 alone holds 30 >= 20 clips
        (2, 200, 32),
        (3, 300, 35),
    ]  # newest first until 20 clips (5, then 35)
    assert [e["step"] for e in s.pool] == [6, 5, 4]


def test_cadence_shadow_every_feeds_the_pool_and_interval_refits():
    s = state(interval=4, shadow_every=2)
    assert [t for t in range(13) if s.is_shadow_step(t)] == [0, 2, 4, 6, 8, 10, 12]
    assert [t for t in range(13) if s.is_refit_step(t)] == [4, 8, 12]
    results = {t: s.observe(t, *_step_tokens(100, 2, seed=t)) for t in range(0, 13, 2)}
    assert [t for t, r in results.items() if r is not None] == [4, 8, 12]
    assert results[4].pool_steps == 2  # steps 4 and 2 (step 0 never enters)
    assert CalibrationState(0.8, 1.2, interval=20).shadow_every == 20  # default: interval
    with pytest.raises(
        ValueError, match=r"interval \(6\) must be a multiple of shadow_every \(4\)"
    ):
        state(interval=6, shadow_every=4)


def test_paper_rule_refits_on_the_step_alone_including_step_zero():
    s = state(interval=2, rule="paper")
    first = s.observe(0, *_step_tokens(100, 10))
    assert first is not None and first.pool_steps == 1 and first.rule == "paper"
    assert s.observe(1, *_step_tokens(100, 10)) is None
    assert s.observe(2, *_step_tokens(80, 10)).n_neg == 80 and len(s.pool) == 0


def test_the_pool_is_subsampled_oldest_steps_first_deterministically():
    s = state(pool_min_clips=1000, pool_window=3, pool_max_tokens=250, min_tokens=8, seed=3)
    for step in (1, 2):
        s.observe(
            step, *_step_tokens(100, 5, noise=0.01, seed=step)
        )  # 140 tokens each (100 N + 40 P)
    r, rh, adv, n_steps = s._pooled(3)
    assert n_steps == 2 and r.numel() == 250  # the newest 140 whole, 110 of the older
    newest = s.pool[0]
    assert torch.equal(r[:140], newest["ratio"])
    older = s.pool[1]["ratio"]
    assert bool(torch.isin(r[140:], older).all()) and r[140:].unique().numel() == 110
    again = s._pooled(3)[0]
    assert torch.equal(again, r)  # seeded by (seed, refit step)
    assert not torch.equal(s._pooled(4)[0], r)
    # a single step above the cap is subsampled itself
    big = state(pool_max_tokens=50, min_tokens=8)
    res = big.observe(1, *_step_tokens(100, 5))
    assert res.n_neg + res.n_pos == 50


def test_an_empty_pool_keeps_the_bounds_and_says_why():
    s = state(interval=1)
    res = s.observe(1, *(x[:0] for x in _step_tokens(10, 1)))
    assert not res.updated and res.pool_steps == 1 and "too few tokens" in res.reason
    s2 = state(interval=1)
    s2.pool.clear()
    r, rh, adv, n = s2._pooled(1)
    assert n == 0 and r.numel() == 0


def test_state_and_pool_round_trip_through_json_and_safetensors(tmp_path):
    import json

    def run(s, steps):
        return [s.observe(t, *_step_tokens(120, 3 + t, noise=0.05, seed=t)) for t in steps]

    a = state(pool_min_clips=15, pool_window=4)
    run(a, range(0, 4))
    save_file(a.pool_tensors(), str(tmp_path / "pool.safetensors"))
    text = json.dumps(a.state_dict(), allow_nan=False)
    b = CalibrationState(0.5, 1.5)
    b.load_state_dict(json.loads(text))
    b.load_pool_tensors(load_file(str(tmp_path / "pool.safetensors")))
    assert b.state_dict() == a.state_dict() and [e["step"] for e in b.pool] == [3, 2, 1]
    assert [r.as_dict() for r in run(a, range(4, 8))] == [r.as_dict() for r in run(b, range(4, 8))]
    with pytest.raises(ValueError, match="missing tensor"):
        b.load_pool_tensors({"0.step": torch.tensor([1])})
