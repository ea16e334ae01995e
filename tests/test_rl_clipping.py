"""The clip indicators by hand: where a step's ratios leave the bounds (clip_decomposition)."""

import pytest
import torch

from fp8rl.rl import clip_decomposition


def test_clip_decomposition_hand_example():
    ratio = torch.tensor([0.7, 0.7, 1.3, 1.3, 1.0, 5.0])
    adv = torch.tensor([-1.0, 1, 1, -1, 0, -1])
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    d = clip_decomposition(ratio, adv, mask, 0.8, 1.2)
    # One token in each (bound x sign) cell, out of 5 masked tokens; the masked 5.0 is ignored.
    for k in (
        "clipfrac_lower_neg",
        "clipfrac_lower_pos",
        "clipfrac_upper_pos",
        "clipfrac_upper_neg",
    ):
        assert d[f"actor/{k}"].item() == pytest.approx(0.2), k
    assert d["actor/clipfrac"].item() == pytest.approx(0.4)
    assert d["actor/clip_lower_share"].item() == pytest.approx(0.5)
    assert set(clip_decomposition(ratio, adv, mask, 0.8, 1.2, prefix="shadow/")) == {
        k.replace("actor/", "shadow/") for k in d
    }
