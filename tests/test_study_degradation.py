"""The degradation rule on constructed trajectories, with the steps each criterion must fire
at derived by hand (study/degradation.py's docstring states the thresholds)."""

import math

import pytest

from fp8rl.study.degradation import degradation

N = 60


def run(entropy=None, reward=None, garble=None):
    """A stable arm (entropy 0.5, reward 0.5, 5 % garbled) with the given trajectories."""
    return {
        "entropy": entropy if entropy is not None else [0.5] * N,
        "reward": reward if reward is not None else [0.5] * N,
        "malformed_frac": garble if garble is not None else [0.05] * N,
    }


REF = {"entropy": [0.5] * N}


def test_a_stable_noisy_trajectory_fires_nothing():
    wiggle = [(-1) ** t for t in range(N)]
    arm = run(
        entropy=[0.5 + 0.05 * w for w in wiggle],
        reward=[0.5 + 0.05 * w for w in wiggle],
        garble=[0.1 + 0.05 * w for w in wiggle],
    )
    got = degradation(arm, REF)
    assert got.fired == {} and not got.degraded and got.first_step is None


def test_entropy_surge_above_the_band_alone():
    # 0.5 * 1.03**t passes 2 * 0.5 = 1.0 at t = 24 (1.016; t = 23: 0.987): the 10th step
    # above is 33. The surge detector stays quiet: each value is 1.03**10.5 ~ 1.36 < 1.5
    # times the median of the previous 20.
    arm = run(entropy=[0.5 * 1.03**t for t in range(N)])
    got = degradation(arm, REF)
    assert got.fired == {"entropy_surge": 33} and got.first_step == 33


def test_entropy_collapse_below_the_band_alone():
    # 0.5 * 0.97**t falls under 0.5 / 2 = 0.25 at t = 23 (0.248; t = 22: 0.256): fires at 32
    arm = run(entropy=[0.5 * 0.97**t for t in range(N)])
    assert degradation(arm, REF).fired == {"entropy_collapse": 32}


def test_the_band_spans_the_reference_seeds():
    seeds = [{"entropy": [0.4] * N}, {"entropy": [0.6] * N}]  # band 0.4..0.6
    assert degradation(run(entropy=[1.1] * N), seeds).fired == {}  # 1.1 < 2 * 0.6
    assert degradation(run(entropy=[1.3] * N), seeds).fired == {"entropy_surge": 9}
    assert degradation(run(entropy=[0.21] * N), seeds).fired == {}  # 0.21 > 0.4 / 2
    assert degradation(run(entropy=[0.19] * N), seeds).fired == {"entropy_collapse": 9}
    # only the steps both runs have: a 5-step reference never gives 10 in a row
    assert degradation(run(entropy=[1.3] * N), {"entropy": [0.5] * 5}).fired == {}


def test_surge_detector_alone_and_without_a_reference():
    # 0.8 > 1.5 * 0.5 at steps 30-32 (the median of the previous 20 stays 0.5), inside the
    # band (0.8 < 1.0): the detector's 3rd consecutive flag is step 32
    entropy = [0.5] * N
    entropy[30:33] = [0.8] * 3
    assert degradation(run(entropy=entropy), REF).fired == {"surge_detector": 32}
    assert degradation(run(entropy=entropy), None).fired == {"surge_detector": 32}
    entropy[32] = 0.5  # two flags in a row are not enough
    assert degradation(run(entropy=entropy), REF).fired == {}


def test_a_step_change_fires_the_band_and_the_detector():
    # 1.2 from step 30: above 1.0 from 30 (band fires at 39); the detector flags 30-40 (the
    # median of the previous 20 turns 1.2 at step 41) and fires at 32
    arm = run(entropy=[0.5] * 30 + [1.2] * 30)
    got = degradation(arm, REF)
    assert got.fired == {"entropy_surge": 39, "surge_detector": 32} and got.first_step == 32


def test_reward_drop_that_stays():
    # 0.5 then 0.28 from step 30: the 10-step mean is 0.5 - 0.022 (t - 29), under
    # best - 0.1 = 0.4 from t = 34 (0.39; t = 33: 0.412): the 20th step below is 53
    arm = run(reward=[0.5] * 30 + [0.28] * 30)
    assert degradation(arm, REF).fired == {"reward_drop": 53}


def test_reward_dip_that_recovers_does_not_fire():
    # 0.28 at steps 30-39: the 10-step mean is under 0.4 at steps 34-44 only (11 < 20)
    arm = run(reward=[0.5] * 30 + [0.28] * 10 + [0.5] * 20)
    assert degradation(arm, REF).fired == {}


def test_reward_that_keeps_improving_does_not_fire():
    arm = run(reward=[min(1.0, 0.1 + 0.02 * t) for t in range(N)])
    assert degradation(arm, REF).fired == {}


def test_garble_rate_above_its_level():
    # 0.05 then 0.5 from step 40: the 10-step mean is 0.05 + 0.045 (t - 39), above 0.2
    # from t = 43 (0.23; t = 42: 0.185)
    arm = run(garble=[0.05] * 40 + [0.5] * 20)
    assert degradation(arm, REF).fired == {"garble": 43}


def test_non_finite_entropy_is_a_surge_and_missing_keys_raise():
    entropy = [0.5] * N
    entropy[10:13] = [math.nan] * 3
    assert degradation(run(entropy=entropy), None).fired == {"surge_detector": 12}
    with pytest.raises(ValueError, match="malformed_frac"):
        degradation({"entropy": [0.5], "reward": [0.5]}, REF)
    with pytest.raises(ValueError, match="reference"):
        degradation(run(), [])
