"""Diagnostics: hand-derived shadow metrics, clip decomposition, high-entropy attribution,
k3 KL."""

import math
import statistics

import pytest
import torch

from fp8rl.rl import (
    clip_decomposition,
    high_entropy_lower_clip_share,
    k3_kl,
    shadow_metrics,
)
from fp8rl.rl.shadow import ShadowRows
from helpers import shadow_case

F64 = torch.float64
NAN = float("nan")


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


def test_k3_hand_example():
    # d = log q - log p = ln 2, ln .5, 0: (e^d - 1 - d) = 1 - ln 2, ln 2 - .5, 0 -> mean .5 / 3.
    log_p = torch.log(torch.tensor([0.2, 0.4, 0.3, 0.9], dtype=F64))
    log_q = torch.log(torch.tensor([0.4, 0.2, 0.3, 1e-9], dtype=F64))
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    assert k3_kl(log_p, log_q, mask).item() == pytest.approx(0.5 / 3, rel=1e-12)
    assert k3_kl(log_p, log_p, mask).item() == 0.0
