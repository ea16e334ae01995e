"""Policy losses and aggregations: hand-derived values, float64 gradient re-derivation,
exact micro-batch accumulation, and the registry's argument errors."""

import math
import pathlib
import zlib

import pytest
import torch

import fp8rl.rl as rl
from fp8rl.rl import AGGREGATIONS, POLICY_LOSSES, aggregate, policy_loss
from fp8rl.rl.loss_modes import LOSS_MODES
from helpers_rl import agg_coefficients, assert_micro_batches_add_up, random_loss_batch

F64 = torch.float64

# One row, six tokens; r = exp(logp - logp_old) chosen per token, bounds (0.8, 1.2):
#   t0 r=0.5 A=-1  lower clip: -min(-0.5, -0.8) = 0.8, no gradient
#   t1 r=0.5 A=+2  A>0 below L is not clipped: -min(1.0, 1.6) = -1.0
#   t2 r=1.5 A=+1  upper clip: -min(1.5, 1.2) = -1.2, no gradient
#   t3 r=1.5 A=-2  A<0 above H is not clipped: -min(-3.0, -2.4) = 3.0
#   t4 r=1.0 A=.5  -0.5
#   t5 r=4.0 A=-1  -min(-4, -1.2) = 4.0; with dual clip c=3: min(4, 3) = 3, no gradient
RATIOS = [0.5, 0.5, 1.5, 1.5, 1.0, 4.0]
ADV = [-1.0, 2.0, 1.0, -2.0, 0.5, -1.0]
LOGP = [-1.0, -2.0, -0.5, -1.0, -0.25, -0.1]


def hand_inputs(requires_grad=True):
    lp = torch.tensor([LOGP], dtype=F64, requires_grad=requires_grad)
    old = lp.detach() - torch.log(torch.tensor([RATIOS], dtype=F64))
    return lp, old, torch.tensor([ADV], dtype=F64), torch.ones(1, 6, dtype=torch.bool)


@pytest.mark.parametrize("mode", ["grpo", "dapo", "relax_lower", "calibrated"])
def test_ppo_clip_hand_example(mode):
    # these modes differ only in their bound source: one loss serves them all
    lp, old, adv, mask = hand_inputs()
    name = LOSS_MODES[mode].loss
    loss, metrics = policy_loss(name, lp, old, adv, mask, lower=0.8, upper=1.2)
    # token-mean: (0.8 - 1.0 - 1.2 + 3.0 - 0.5 + 4.0) / 6 = 5.1 / 6
    assert loss.item() == pytest.approx(5.1 / 6, abs=1e-12)
    loss.backward()
    # d loss_i / d logp_i = -A_i r_i / 6 for unclipped tokens, 0 for clipped ones.
    expected = torch.tensor([[0.0, -1.0, 0.0, 3.0, -0.5, 4.0]], dtype=F64) / 6
    torch.testing.assert_close(lp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["actor/clipfrac_lower_neg"].item() == pytest.approx(1 / 6)
    assert metrics["actor/clipfrac_upper_pos"].item() == pytest.approx(1 / 6)
    assert metrics["actor/clipfrac"].item() == pytest.approx(2 / 6)
    # ppo_kl = mean(logp_old - logp) = -(2 ln .5 + 2 ln 1.5 + ln 4) / 6 = -ln(2.25) / 6
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-math.log(2.25) / 6)
    assert metrics["actor/ratio_mean"].item() == pytest.approx(9 / 6)
    assert metrics["actor/pg_loss"].item() == pytest.approx(5.1 / 6)
    for v in metrics.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad


def test_dual_clip_hand_example():
    lp, old, adv, mask = hand_inputs()
    loss, metrics = policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2, dual_clip=3.0)
    # t5 becomes min(4, 3) = 3: (5.1 - 1) / 6, and loses its gradient.
    assert loss.item() == pytest.approx(4.1 / 6, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[0.0, -1.0, 0.0, 3.0, -0.5, 0.0]], dtype=F64) / 6
    torch.testing.assert_close(lp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["actor/clipfrac_dual"].item() == pytest.approx(1 / 6)


def test_cispo_hand_example():
    lp, old, adv, mask = hand_inputs()
    loss, metrics = policy_loss("cispo", lp, old, adv, mask, lower=0.8, upper=1.2)
    # w = sg(clamp(r, .8, 1.2)) = [.8, .8, 1.2, 1.2, 1, 1.2]; loss_i = -w A logp:
    # -0.8 + 3.2 + 0.6 - 2.4 + 0.125 - 0.12 = 0.605, token-mean 0.605 / 6.
    assert loss.item() == pytest.approx(0.605 / 6, abs=1e-12)
    loss.backward()
    # Every token keeps a gradient: -w A / 6.
    expected = torch.tensor([[0.8, -1.6, -1.2, 2.4, -0.5, 1.2]], dtype=F64) / 6
    torch.testing.assert_close(lp.grad, expected, rtol=0, atol=1e-12)
    # t0, t1, t2, t3, t5 have r outside [0.8, 1.2].
    assert metrics["actor/cispo_truncfrac"].item() == pytest.approx(5 / 6)
    assert metrics["actor/clipfrac"].item() == pytest.approx(2 / 6)


def bapo_case(ratios, adv):
    r = torch.tensor([ratios], dtype=F64)
    lp = torch.zeros_like(r, requires_grad=True)
    return lp, -torch.log(r), torch.tensor([adv], dtype=F64), torch.ones_like(r, dtype=torch.bool)


def test_bapo_raises_the_lower_bound_first():
    # N: (r .72, A -1), (1.0, -1); P: (1.0, +1), (1.5, +1). Target share 0.5.
    # L in {.6, .65, .7}: pos = 1.0 (1.5 > 1.2), neg = .72 + 1.0 -> share 1 / 2.72 < .5.
    # L = .75 drops .72: neg = 1.0, share = .5 -> bounds (.75, 1.2).
    # Loss: .72 clipped -> .75; 1.0 -> 1.0; -1.0; 1.5 clipped -> -1.2: (-0.45) / 4.
    lp, old, adv, mask = bapo_case([0.72, 1.0, 1.0, 1.5], [-1, -1, 1, 1])
    loss, metrics = policy_loss("bapo", lp, old, adv, mask, lower=0.6, upper=1.2)
    assert metrics["actor/bapo_lower"].item() == pytest.approx(0.75)
    assert metrics["actor/bapo_upper"].item() == pytest.approx(1.2)
    assert metrics["actor/bapo_pos_share"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-0.45 / 4)
    assert metrics["actor/clipfrac_lower_neg"].item() == pytest.approx(0.25)


def test_bapo_then_raises_the_upper_bound():
    # N: (1.0, -3) stays in for every L <= .9: neg = 3. P: (1.0, +1), (1.38, +2).
    # H < 1.38: pos = 1, share .25. H = 1.4 takes 1.38 in: pos = 1 + 2.76 = 3.76,
    # share 3.76 / 6.76 = .556 -> bounds (.9, 1.4). Loss (3 - 1 - 2.76) / 3.
    lp, old, adv, mask = bapo_case([1.0, 1.0, 1.38], [-3, 1, 2])
    loss, metrics = policy_loss("bapo", lp, old, adv, mask, lower=0.6, upper=1.2)
    assert metrics["actor/bapo_lower"].item() == pytest.approx(0.9)
    assert metrics["actor/bapo_upper"].item() == pytest.approx(1.4)
    assert metrics["actor/bapo_pos_share"].item() == pytest.approx(3.76 / 6.76)
    assert loss.item() == pytest.approx(-0.76 / 3)


def test_bapo_stops_at_the_last_candidate_when_the_target_is_out_of_reach():
    # neg = 10 at every L, pos <= 1: share never reaches .5 -> (.9, 3.0).
    lp, old, adv, mask = bapo_case([1.0, 1.0], [-10, 1])
    _, metrics = policy_loss("bapo", lp, old, adv, mask, lower=0.6, upper=1.2)
    assert metrics["actor/bapo_lower"].item() == pytest.approx(0.9)
    assert metrics["actor/bapo_upper"].item() == pytest.approx(3.0)


# Aggregation example: rows [1, 2, 3, (4)] and [5, 6, (0), (0)], parenthesised = masked.
LOSS_MAT = torch.tensor([[1.0, 2, 3, 4], [5, 6, 0, 0], [7, 7, 7, 7]], dtype=F64)
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "agg, options, expected",
    [
        ("token-mean", {}, 17 / 5),  # (1+2+3+5+6) / 5 tokens
        (
            "seq-mean-token-mean",
            {},
            (6 / 3 + 11 / 2) / 2,
        ),  # mean of row means; the empty row is not a sequence
        ("seq-mean-token-sum", {}, (6 + 11) / 2),
        ("seq-mean-token-sum-norm", {}, 17 / (2 * 4)),  # Dr. GRPO: / (n_seqs * T)
        ("seq-mean-token-sum-norm", {"norm_len": 10}, 17 / 20),
        ("token-mean", {"global_token_count": 10}, 17 / 10),
        ("seq-mean-token-mean", {"global_seq_count": 4}, 7.5 / 4),
    ],
)
def test_aggregation_hand_examples(agg, options, expected):
    got = aggregate(LOSS_MAT, AGG_MASK, agg, **options)
    assert got.item() == pytest.approx(expected, abs=1e-12)
    # A NaN at a masked position changes nothing.
    poisoned = LOSS_MAT.clone()
    poisoned[0, 3] = float("nan")
    assert aggregate(poisoned, AGG_MASK, agg, **options).item() == pytest.approx(
        expected, abs=1e-12
    )


def test_aggregation_of_nothing_is_zero_and_flat_input_is_token_mean_only():
    empty = torch.zeros(2, 3, dtype=torch.bool)
    for agg in AGGREGATIONS:
        assert aggregate(torch.ones(2, 3), empty, agg).item() == 0.0
    flat = torch.tensor([1.0, 2.0, 6.0])
    assert aggregate(flat, torch.tensor([True, False, True])).item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="needs \\(B, T\\) rows"):
        aggregate(flat, torch.ones(3, dtype=torch.bool), "seq-mean-token-mean")


def random_batch(seed, B=5, T=7):
    return random_loss_batch(seed, B, T, sd=0.4)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize(
    "name, options",
    [
        ("ppo_clip", {}),
        ("ppo_clip", {"dual_clip": 2.0}),
        ("cispo", {}),
        ("bapo", {}),
    ],
)
def test_gradient_matches_a_float64_rederivation(name, options, agg):
    lp, old, adv, mask, tis = random_batch(seed=zlib.crc32(f"{name}{options}{agg}".encode()) % 1000)
    lower, upper = (0.6, 1.2) if name == "bapo" else (0.8, 1.25)
    loss, metrics = policy_loss(
        name, lp, old, adv, mask, lower=lower, upper=upper, agg=agg, tis_weights=tis, **options
    )
    (grad,) = torch.autograd.grad(loss, lp)

    r = torch.exp(lp.detach() - old)
    a = adv[:, None].expand_as(r)
    if name == "bapo":
        lower, upper = metrics["actor/bapo_lower"].item(), metrics["actor/bapo_upper"].item()
    if name == "cispo":
        per_token = -r.clamp(lower, upper) * a
    else:
        clipped = ((a < 0) & (r < lower)) | ((a > 0) & (r > upper))
        if "dual_clip" in options:
            clipped |= (a < 0) & (r > options["dual_clip"])
        per_token = torch.where(clipped, 0.0, -a * r)
        assert clipped[mask].any() and not clipped[mask].all()  # both kinds are exercised
    expected = per_token * tis * agg_coefficients(mask, agg)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)
    assert (grad[~mask] == 0).all()


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batches_add_up_to_the_mini_batch(agg):
    batch = random_batch(seed=7, B=6, T=5)
    parts = (slice(0, 2), slice(2, 3), slice(3, 6))
    assert_micro_batches_add_up("ppo_clip", batch, parts, lower=0.8, upper=1.2, agg=agg)


def test_padding_garbage_does_not_reach_loss_or_gradient():
    lp, old, adv, mask, tis = random_batch(seed=3)
    clean, _ = policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2)
    (g_clean,) = torch.autograd.grad(clean, lp)
    lp2 = lp.detach().clone()
    lp2[~mask] = -float("inf")
    lp2.requires_grad_()
    old2 = old.clone()
    old2[~mask] = float("nan")
    dirty, _ = policy_loss("ppo_clip", lp2, old2, adv, mask, lower=0.8, upper=1.2)
    (g_dirty,) = torch.autograd.grad(dirty, lp2)
    assert dirty.item() == clean.item()
    assert torch.equal(g_dirty, g_clean)


def test_flat_token_vectors_give_the_token_mean_of_the_rows():
    lp, old, adv, mask, _ = random_batch(seed=5)
    rows, _ = policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2)
    a = adv[:, None].expand_as(lp)
    flat, _ = policy_loss(
        "ppo_clip",
        lp[mask],
        old[mask],
        a[mask],
        torch.ones(int(mask.sum()), dtype=torch.bool),
        lower=0.8,
        upper=1.2,
    )
    torch.testing.assert_close(flat, rows)


def test_registry_rejects_bad_input_clearly():
    lp, old, adv, mask, _ = random_batch(seed=1)
    with pytest.raises(
        ValueError,
        match="unknown policy loss 'ppo'; valid: bapo, cispo, gspo, oracle_clip, ppo_clip$",
    ):
        policy_loss("ppo", lp, old, adv, mask, lower=0.8, upper=1.2)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['dual'\].*dual_clip"):
        policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2, dual=3.0)
    with pytest.raises(ValueError, match="lower = 1.1"):
        policy_loss("ppo_clip", lp, old, adv, mask, lower=1.1, upper=1.2)
    with pytest.raises(ValueError, match="upper = 0.9"):
        policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=0.9)
    with pytest.raises(ValueError, match="dual_clip = 0.5"):
        policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2, dual_clip=0.5)
    with pytest.raises(ValueError, match="unknown agg 'mean'; valid: token-mean"):
        policy_loss("ppo_clip", lp, old, adv, mask, lower=0.8, upper=1.2, agg="mean")
    with pytest.raises(ValueError, match=r"old_log_prob has shape \(5, 6\)"):
        policy_loss("ppo_clip", lp, old[:, :6], adv, mask, lower=0.8, upper=1.2)
    with pytest.raises(ValueError, match=r"advantages has shape \(4,\)"):
        policy_loss("ppo_clip", lp, old, adv[:4], mask, lower=0.8, upper=1.2)
    with pytest.raises(ValueError, match="already registered"):
        rl.register_policy_loss("ppo_clip")(lambda *a, **k: None)


def test_the_catalogue_registers_every_built_in_loss_by_its_own_name():
    # the table at the end of rl/losses.py, with no other module to import first
    from fp8rl.rl import losses

    built_in = {"ppo_clip", "cispo", "bapo", "gspo", "oracle_clip"}
    assert built_in <= set(POLICY_LOSSES)
    assert all(POLICY_LOSSES[name] is getattr(losses, name) for name in built_in)


def test_a_registered_loss_is_usable_through_policy_loss():
    name = "test_only_linear"

    @rl.register_policy_loss(name)
    def linear(lp, old, adv, m, *, lower, upper, scale=1.0):
        return -scale * adv * lp, {}

    try:
        lp = torch.tensor([[-1.0, -2.0]])
        loss, metrics = policy_loss(
            name, lp, lp, torch.tensor([2.0]), torch.ones(1, 2), lower=0.8, upper=1.2, scale=0.5
        )
        # -0.5 * 2 * (-1 - 2) / 2 tokens = 1.5
        assert loss.item() == pytest.approx(1.5)
        assert set(metrics) == {"actor/pg_loss"}
    finally:
        del POLICY_LOSSES[name]


def test_rl_sources_never_call_item():
    # .item() forces a device sync per call; the rl core must not hide one in a hot path.
    src = pathlib.Path(rl.__file__).parent
    offenders = [p.name for p in src.glob("*.py") if ".item()" in p.read_text()]
    assert offenders == []
