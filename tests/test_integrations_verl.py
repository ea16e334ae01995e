"""fp8rl_calibrated in verl's registry, and fp8rl's gspo loss against verl's own. Runs where
verl is installed (scripts/check-verl.sh)."""

import ast
from pathlib import Path

import pytest
import torch

from fp8rl.integrations import verl as fv
from fp8rl.rl.calibration_state import CalibrationState
from fp8rl.rl.loss_modes import LOSS_MODES
from fp8rl.rl.losses import policy_loss


def test_module_imports_without_verl_and_says_so():
    assert fv.register() == fv.verl_available()


def test_the_loss_module_never_imports_the_worker():
    # the worker depends on the loss (its state, its name), so the reverse would be a cycle
    imported = []
    for n in ast.walk(ast.parse(Path(fv.__file__).read_text())):
        if isinstance(n, ast.Import):
            imported += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            imported += [n.module or "", *(a.name for a in n.names)]
    assert "verl.trainer.ppo" in imported  # the walk sees imports inside functions too
    assert not [m for m in imported if "verl_worker" in m]
    assert not hasattr(fv, "Fp8rlTrainingWorker")  # no lazy re-export either


verl = pytest.importorskip("verl", reason="verl is not installed here: run scripts/check-verl.sh")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")


def actor_config(**kw):
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=2, rollout_n=1, **kw)


def tensors(seed=0, b=6, t=7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    lp = old + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    mask[:, 0] = 1
    w = torch.rand(b, t, generator=g) + 0.5
    return old, lp, adv, mask, w


def test_registered_under_its_name():
    assert core_algos.get_policy_loss_fn(fv.LOSS_NAME) is fv.calibrated_policy_loss


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("with_is", [False, True])
def test_nominal_bounds_equal_verl_vanilla(agg, with_is):
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    fv.set_calibration_state(CalibrationState(lower=0.8, upper=1.28))
    old, lp, adv, mask, w = tensors()
    kw = dict(
        old_log_prob=old,
        log_prob=lp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=cfg,
        rollout_is_weights=w if with_is else None,
    )
    ours, m_ours = core_algos.get_policy_loss_fn(fv.LOSS_NAME)(**kw)
    ref, m_ref = core_algos.get_policy_loss_fn("vanilla")(**kw)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    for k, v in m_ref.items():
        assert m_ours[k] == v, k


def test_calibrated_bounds_change_the_clipping():
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.2)
    old, lp, adv, mask, _ = tensors(1, b=64, t=16)
    state = CalibrationState(lower=0.8, upper=1.2, interval=5, min_tokens=4)
    fv.set_calibration_state(state)
    # FP8-like noise on the current log-probs only: more ratios fall under 0.8 than in BF16
    noisy = lp + 0.2 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(3))
    assert (
        fv.calibrate_from_reference(3, old, noisy, old, lp, adv, mask) is None
    )  # not a calibration step
    result = fv.calibrate_from_reference(5, old, noisy, old, lp, adv, mask)
    assert result.updated and state.lower < 0.8
    _, m = fv.calibrated_policy_loss(old, noisy, adv, mask, "token-mean", cfg)
    assert m["calib/lower"] == state.lower
    r = torch.exp(noisy - old)
    expected = ((r < state.lower) & (adv < 0) & mask.bool()).sum() / mask.sum()
    assert m["fp8rl/clipfrac_lower_neg"] == pytest.approx(float(expected))


def gspo_batch(seed=0, b=64, t=9):
    """Token log-ratios of sd 2e-3: sequence ratios on both sides of GSPO's narrow range and
    inside it. Row 0's mean log-ratio is 12, beyond GSPO's clamp at 10."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    old = -torch.rand(b, t, generator=g, dtype=f64) * 3
    lp = old + 2e-3 * torch.randn(b, t, generator=g, dtype=f64)
    lp[0] = old[0] + 12.0
    adv = torch.randn(b, 1, generator=g, dtype=f64).expand(b, t).contiguous()
    adv[0] = -1.0  # would be clipped at neither bound: the clamp alone decides its gradient
    mask = (torch.rand(b, t, generator=g) > 0.25).to(f64)
    mask[:, 0] = 1
    w = torch.rand(b, t, generator=g, dtype=f64) + 0.5
    return old, lp, adv, mask, w


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("bounds", ["gspo", (0.9993, 1.0011)])  # its nominal, and moved ones
def test_gspo_equals_verl_gspo_in_value_and_gradient(agg, with_is, bounds):
    if bounds == "gspo":
        mode = LOSS_MODES["gspo"]
        bounds = (1 - mode.eps_low, 1 + mode.eps_high)
    lower, upper = bounds
    cfg = actor_config(clip_ratio_low=1 - lower, clip_ratio_high=upper - 1)
    old, lp, adv, mask, w = gspo_batch()
    ours_lp, ref_lp = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    weights = w if with_is else None
    ours, _ = policy_loss(
        "gspo", ours_lp, old, adv, mask, lower=lower, upper=upper, agg=agg, tis_weights=weights
    )
    ref, _ = core_algos.get_policy_loss_fn("gspo")(
        old_log_prob=old,
        log_prob=ref_lp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=cfg,
        rollout_is_weights=weights,
    )
    (g_ours,) = torch.autograd.grad(ours, ours_lp)
    (g_ref,) = torch.autograd.grad(ref, ref_lp)
    # verl divides a row's token sum by (count + 1e-8) where fp8rl divides by the count
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=0)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-8, atol=1e-15)
    s = torch.exp((((lp - old) * mask).sum(-1) / mask.sum(-1)).clamp(max=10.0))
    a = adv[:, 0]
    kinds = [(a < 0) & (s < lower), (a > 0) & (s > upper), (s >= lower) & (s <= upper)]
    assert all(k.sum() >= 3 for k in kinds)  # lower clips, upper clips and free rows all occur
    assert s[0] == pytest.approx(torch.exp(torch.tensor(10.0)).item())
    assert (g_ours[0] == 0).all() and (g_ours[1:][mask[1:].bool()] != 0).any()
