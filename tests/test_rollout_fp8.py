"""FP8 (W8A8) rollout: it differs from the high-precision trainer, and follows weight updates."""

import copy

import pytest
import torch

from fp8rl.fp8 import Fp8Recipe, convert_to_fp8, fp8_linears, high_precision, use_recipe
from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=6)


def fp8_model(recipe: str):
    model = tiny_qwen3(seed=0, initializer_range=0.1).eval()
    report = convert_to_fp8(model, recipe)
    assert report.converted
    return model, len(report.converted)


def quantizations(model) -> int:
    return sum(m.weight_quantizations for m in fp8_linears(model))


def k3(log_p, log_q, mask):
    """k3 estimate of KL(p || q) from tokens drawn from p."""
    d = (log_q - log_p)[mask]
    return (torch.expm1(d) - d).mean().item()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_fp8_rollout_differs_from_the_high_precision_trainer(recipe):
    model, layers = fp8_model(recipe)
    engine = RolloutEngine(
        model, recipe=Fp8Recipe.from_name(recipe), pad_token_id=0, eos_token_id=[]
    )
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8)
    with high_precision(model):  # the rollout must switch to its own recipe, then back
        batch = engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(0))
        assert all(m.recipe is None for m in fp8_linears(model))
        assert quantizations(model) == layers  # it did run FP8 GEMMs
        with torch.no_grad():
            trainer, _ = compute_log_probs(model, batch, temperature=1.0)
    gap = (trainer - batch.log_probs).abs().max().item()
    kl = k3(batch.log_probs, trainer, batch.response_mask)
    print(f"{recipe}: rollout/trainer max |dlogp| {gap:.4f}, k3 KL {kl:.3e}")
    assert gap > 1e-3
    assert 0 < kl < 1.0


def test_one_prefill_per_prompt_equals_repeating_the_prompt():
    model, _ = fp8_model("tensorwise")  # the recipe whose scales see the whole batch
    engine = RolloutEngine(model, recipe="tensorwise", pad_token_id=0, eos_token_id=[])
    shared = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_new_tokens=6))
    repeated = engine.generate([p for p in PROMPTS for _ in range(2)], GREEDY)
    assert torch.equal(shared.response_ids, repeated.response_ids)
    torch.testing.assert_close(shared.log_probs, repeated.log_probs, atol=1e-5, rtol=0)


def test_high_precision_engine_on_an_fp8_model_is_exact():
    model, _ = fp8_model("rowwise")  # layers default to rowwise after conversion
    engine = RolloutEngine(model, recipe=None, pad_token_id=0, eos_token_id=[])
    batch = engine.generate(
        PROMPTS,
        SamplingParams(n=2, temperature=0.8, max_new_tokens=6),
        generator=torch.Generator().manual_seed(0),
    )
    assert quantizations(model) == 0
    with torch.no_grad(), high_precision(model):
        trainer, _ = compute_log_probs(model, batch, temperature=0.8)
    torch.testing.assert_close(trainer, batch.log_probs, atol=1e-5, rtol=0)
    with torch.no_grad():  # the trainer forward itself runs whatever recipe is set: rowwise
        fp8_trainer, _ = compute_log_probs(model, batch, temperature=0.8)
    assert (fp8_trainer - batch.log_probs).abs().max() > 1e-3


def _optimizer_step(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with high_precision(model):  # no FP8 GEMM here: the only cache invalidation is the update
        lp, _ = compute_log_probs(model, batch)
    (-(lp * batch.response_mask).sum()).backward()
    opt.step()
    opt.zero_grad()


def test_weight_updates_are_picked_up_and_nothing_else_requantizes():
    model, layers = fp8_model("rowwise")
    engine = RolloutEngine(model, recipe="rowwise", pad_token_id=0, eos_token_id=[])
    before = engine.generate(PROMPTS, GREEDY)
    assert quantizations(model) == layers
    again = engine.generate(PROMPTS, GREEDY)
    assert quantizations(model) == layers and engine.sync_weights() == 0
    assert torch.equal(again.log_probs, before.log_probs)

    _optimizer_step(model, before)  # lazily: the next generate re-quantizes
    lazily = engine.generate(PROMPTS, GREEDY)
    assert quantizations(model) == 2 * layers
    assert (lazily.log_probs - before.log_probs).abs().max() > 1e-3

    _optimizer_step(model, lazily)  # eagerly: sync_weights does it, generate does not
    assert engine.sync_weights() == layers
    eagerly = engine.generate(PROMPTS, GREEDY)
    assert quantizations(model) == 3 * layers

    # a fresh copy with cold caches quantizes the current weights: same rollout
    fresh = copy.deepcopy(model)
    for m in fp8_linears(fresh):
        m.invalidate_weight_cache()
    reference = RolloutEngine(fresh, recipe="rowwise", pad_token_id=0, eos_token_id=[]).generate(
        PROMPTS, GREEDY
    )
    assert torch.equal(eagerly.response_ids, reference.response_ids)
    torch.testing.assert_close(eagerly.log_probs, reference.log_probs, atol=1e-6, rtol=0)


def test_sync_weights_force_and_high_precision():
    model, layers = fp8_model("tensorwise")
    engine = RolloutEngine(model, recipe="tensorwise", pad_token_id=0)
    assert engine.sync_weights() == layers
    assert engine.sync_weights() == 0
    assert engine.sync_weights(force=True) == layers
    assert RolloutEngine(model, pad_token_id=0).sync_weights() == 0


def test_compute_log_probs_does_not_switch_recipes():
    model, _ = fp8_model("tensorwise")
    batch = RolloutEngine(model, pad_token_id=0, eos_token_id=[]).generate(PROMPTS, GREEDY)
    with torch.no_grad():
        with use_recipe(model, "rowwise"):
            rowwise, _ = compute_log_probs(model, batch)
            assert {m.recipe.name for m in fp8_linears(model)} == {"rowwise"}
        with high_precision(model):
            exact, _ = compute_log_probs(model, batch)
    assert (rowwise - exact).abs().max() > 1e-3
    torch.testing.assert_close(exact, batch.log_probs, atol=1e-5, rtol=0)
