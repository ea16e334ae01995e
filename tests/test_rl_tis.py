"""TIS weights: hand-derived token/sequence x truncate/mask examples; the mismatch measures
(k3 KL) by hand."""

import math

import pytest
import torch

from fp8rl.rl import k3_kl, tis_weights

F64 = torch.float64
LN = math.log


def token_case():
    # One row: old - roll = ln .5, ln 1.5, ln 3, then a padded position holding NaN.
    roll = torch.zeros(1, 4, dtype=F64)
    old = torch.tensor([[LN(0.5), LN(1.5), LN(3.0), float("nan")]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    return old, roll, mask


def test_token_truncate_hand_example():
    old, roll, mask = token_case()
    w, m = tis_weights(old, roll, mask)
    # raw [.5, 1.5, 3] -> min(., 2) = [.5, 1.5, 2]; padding 0.
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.5, 2.0, 0.0]], dtype=F64))
    assert m["actor/tis_weight_mean"].item() == pytest.approx(4 / 3)
    assert m["actor/tis_clipfrac"].item() == pytest.approx(1 / 3)
    assert m["actor/tis_raw_weight_mean"].item() == pytest.approx(5 / 3)
    assert m["actor/tis_raw_weight_max"].item() == pytest.approx(3.0)


def test_token_mask_hand_example():
    old, roll, mask = token_case()
    w, m = tis_weights(old, roll, mask, mode="mask", cap=2.0, cap_min=0.6)
    # .5 < .6 and 3 > 2 are zeroed; 1.5 is kept.
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.5, 0.0, 0.0]], dtype=F64))
    assert m["actor/tis_weight_mean"].item() == pytest.approx(0.5)
    assert m["actor/tis_clipfrac"].item() == pytest.approx(2 / 3)


def sequence_case():
    # Row 0: ln 2 + ln .5 + ln 1.5 = ln 1.5 -> 1.5 on its 3 tokens.
    # Row 1: ln 2 + ln 2 = ln 4 on its 2 tokens (third padded).
    old = torch.tensor([[LN(2), LN(0.5), LN(1.5)], [LN(2), LN(2), 123.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return old, torch.zeros_like(old), mask


def test_sequence_truncate_hand_example():
    old, roll, mask = sequence_case()
    w, m = tis_weights(old, roll, mask, level="sequence")
    # Row 1: min(4, 2) = 2. Mean over 5 tokens: (3 * 1.5 + 2 * 2) / 5 = 1.7.
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]], dtype=F64))
    assert m["actor/tis_weight_mean"].item() == pytest.approx(1.7)
    assert m["actor/tis_clipfrac"].item() == pytest.approx(2 / 5)


def test_sequence_mask_hand_example():
    old, roll, mask = sequence_case()
    w, m = tis_weights(old, roll, mask, level="sequence", mode="mask")
    # Row 1 (weight 4 > 2) is dropped whole: (3 * 1.5) / 5 = 0.9.
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]], dtype=F64))
    assert m["actor/tis_weight_mean"].item() == pytest.approx(0.9)


def test_weights_are_detached_and_the_log_difference_is_clamped():
    old = torch.tensor([[100.0, -100.0]], requires_grad=True)
    w, _ = tis_weights(old, torch.zeros(1, 2), torch.ones(1, 2), cap=1e30)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.exp(torch.tensor([[20.0, -20.0]])))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"level": "tok"}, "unknown TIS level 'tok'; valid: token, sequence"),
        ({"mode": "clip"}, "unknown TIS mode 'clip'; valid: truncate, mask"),
        ({"cap": 0.0}, "cap = 0.0"),
        ({"mode": "mask", "cap_min": 3.0}, "cap_min = 3.0"),
        ({"cap_min": 0.5}, "only applies to mode='mask'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tis_weights(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), **kwargs)


def test_sequence_level_needs_rows():
    with pytest.raises(ValueError, match="level='sequence'"):
        tis_weights(torch.zeros(3), torch.zeros(3), torch.ones(3), level="sequence")


def test_k3_hand_example():
    # d = log q - log p = ln 2, ln .5, 0: (e^d - 1 - d) = 1 - ln 2, ln 2 - .5, 0 -> mean .5 / 3.
    log_p = torch.log(torch.tensor([0.2, 0.4, 0.3, 0.9], dtype=F64))
    log_q = torch.log(torch.tensor([0.4, 0.2, 0.3, 1e-9], dtype=F64))
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    assert k3_kl(log_p, log_q, mask).item() == pytest.approx(0.5 / 3, rel=1e-12)
    assert k3_kl(log_p, log_p, mask).item() == 0.0
