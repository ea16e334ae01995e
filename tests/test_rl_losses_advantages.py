"""Advantages (rl/losses.py): hand-derived GRPO / Dr. GRPO / DAPO values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.rl import dynamic_sampling_mask, grpo_advantages, overlong_penalty

F64 = torch.float64


def test_grpo_hand_example():
    # Group 1 = [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3),
    # so the advantages are +-0.5 / (sqrt(1/3) + 1e-6) = +-0.8660239...
    # Group 2 = [1, 1, 1, 1]: centred values 0, std 0: 0 / 1e-6 = 0.
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1], dtype=F64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = torch.tensor([a, -a, -a, a, 0, 0, 0, 0], dtype=F64)
    torch.testing.assert_close(grpo_advantages(rewards, 4), expected, rtol=0, atol=1e-12)


def test_grpo_second_hand_example_and_eps():
    # [3, 1, 2]: mean 2, std sqrt((1 + 1 + 0) / 2) = 1 -> [1, -1, 0] / (1 + eps).
    rewards = torch.tensor([3.0, 1.0, 2.0], dtype=F64)
    torch.testing.assert_close(
        grpo_advantages(rewards, 3, eps=0.25), torch.tensor([0.8, -0.8, 0.0], dtype=F64)
    )


def test_dr_grpo_has_no_std():
    # Dr. GRPO: reward minus group mean only.
    rewards = torch.tensor([1.0, 0, 0, 1, 2, 2, 2, 6], dtype=F64)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, -1, -1, -1, 3], dtype=F64)
    torch.testing.assert_close(grpo_advantages(rewards, 4, std_normalize=False), expected)


def test_group_of_one_is_zero_and_integer_rewards_work():
    out = grpo_advantages(torch.tensor([1, 0, 1]), 1)
    assert out.is_floating_point()
    assert torch.equal(out, torch.zeros(3))


def test_dynamic_sampling_mask_hand_example():
    # Groups of 3: [1,0,1] varied, [1,1,1] all equal, [0,0,0] all equal, [0.5,0.5,0.25] varied.
    rewards = torch.tensor([1.0, 0, 1, 1, 1, 1, 0, 0, 0, 0.5, 0.5, 0.25])
    expected = torch.tensor([True] * 3 + [False] * 6 + [True] * 3)
    assert torch.equal(dynamic_sampling_mask(rewards, 3), expected)


def test_overlong_penalty_hand_example():
    # max_len 20, buffer 5: free up to 15, then -(len - 15) / 5 * factor.
    # len 10 -> 0, 15 -> 0, 17 -> -0.4, 20 -> -1.0, 22 -> -1.4 (the formula is not clamped).
    lengths = torch.tensor([10, 15, 17, 20, 22])
    torch.testing.assert_close(
        overlong_penalty(lengths, 20, 5), torch.tensor([0.0, 0.0, -0.4, -1.0, -1.4])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 20, 5, factor=0.5), torch.tensor([0.0, 0.0, -0.2, -0.5, -0.7])
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: grpo_advantages(torch.zeros(7), 4), "not a multiple of group_size=4"),
        (lambda: grpo_advantages(torch.zeros(8), 0), "group_size"),
        (lambda: grpo_advantages(torch.zeros(2, 4), 4), "rewards must be 1-D"),
        (lambda: dynamic_sampling_mask(torch.zeros(5), 2), "group_size=2"),
        (lambda: overlong_penalty(torch.zeros(3), 10, 11), "buffer = 11"),
        (lambda: overlong_penalty(torch.zeros(3), 10, 0), "buffer = 0"),
        (lambda: overlong_penalty(torch.zeros(3), 10, 2, factor=-1), "factor = -1"),
    ],
)
def test_bad_arguments_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=2, max_size=8).flatmap(
        lambda g: st.tuples(
            st.just(len(g)), st.lists(st.integers(0, 5), min_size=len(g) * 3, max_size=len(g) * 3)
        )
    )
)
def test_grpo_groups_are_centred_and_scaled(args):
    group_size, rewards = args
    r = torch.tensor(rewards, dtype=F64)
    adv = grpo_advantages(r, group_size, eps=1e-12).view(-1, group_size)
    groups = r.view(-1, group_size)
    torch.testing.assert_close(adv.sum(1), torch.zeros(len(groups), dtype=F64), rtol=0, atol=1e-6)
    varied = groups.std(1) > 0
    # Non-constant groups get unit (unbiased) std; constant ones are all zero.
    if varied.any():
        torch.testing.assert_close(adv[varied].std(1), torch.ones(int(varied.sum()), dtype=F64))
    assert torch.equal(adv[~varied], torch.zeros_like(adv[~varied]))
    assert torch.equal(dynamic_sampling_mask(r, group_size).view(-1, group_size)[:, 0], varied)
