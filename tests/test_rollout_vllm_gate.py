"""The mismatch gate on the vLLM path (docs/rollout.md, "Mismatch gates"): vLLM's rollout
against the trainer's forward on a fixed tiny model and batch, for the precision pairs the
vLLM path offers on the CPU, under bounds derived from the formats, and a planted bug (weights
pushed from a differently rounded copy) trips it. Runs where vLLM is installed
(scripts/check-vllm.sh).

On the CPU the vLLM path pushes the rollout recipe's fake-quantized weights (weight-only
quantization; vLLM's activations stay in float32), while the trainer quantizes weights and
activations. So one quantized linear's relative output error variance between the sides is:
the two sides' weight quantizations when the recipes differ (the same recipe quantizes the
same weights bitwise alike), plus the trainer's activation quantization, plus float32 rounding
of two engines' kernels, 2 (EPS32 K)^2. The rest of the derivation is the fp8rl engine's
(tests/_mismatch_bounds.py)."""

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/check-vllm.sh")

from _mismatch_bounds import EPS32, bounds, format_noise, logit_scale  # noqa: E402
from _vllm_tiny import tiny_vllm_setup  # noqa: E402
from fp8rl.config.precision import recipe_for  # noqa: E402
from fp8rl.fp8 import fp8_linears, use_recipe  # noqa: E402
from fp8rl.rl import k3_kl, token_prob_error  # noqa: E402
from fp8rl.rollout import SamplingParams, compute_log_probs  # noqa: E402

PROMPTS = ["1+2=", "7+5=", "3+3=", "9+0=", "12+30=", "4+44="]
PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
PAIRS = [("bf16", "bf16"), ("fp8-rowwise", "fp8-rowwise"), ("fp8-rowwise", "bf16")]


@pytest.fixture(scope="module")
def setup():
    model, _, engine = tiny_vllm_setup()
    return model, engine


def pair_variance(rollout: str, train: str, widest: int) -> float:
    weights = 0.0
    if rollout != train:
        weights = format_noise(rollout, True) ** 2 + format_noise(train, True) ** 2
    return weights + format_noise(train, False) ** 2 + 2 * (EPS32 * widest) ** 2


def measure(setup, monkeypatch, rollout: str, train: str):
    """(KL, token probability error, KL bound, error bound) of the pair on the fixed batch."""
    model, engine = setup
    recipe = recipe_for(rollout)
    monkeypatch.setattr(engine, "recipe", recipe)
    monkeypatch.setattr(engine, "fake_quantized", recipe is not None)
    engine.sync_weights()
    batch = engine.generate(PROMPTS, PARAMS, generator=torch.Generator().manual_seed(2))
    for layer in fp8_linears(model):
        layer.invalidate_weight_cache()
    with torch.no_grad(), use_recipe(model, recipe_for(train)):
        lp, _ = compute_log_probs(model, batch, temperature=batch.temperature)
    s = logit_scale(model, batch)
    mask = batch.response_mask
    kl = float(k3_kl(batch.comparable_log_probs, lp, mask))
    tpe = float(token_prob_error(batch.comparable_log_probs, lp, mask))
    linears = [m for m in fp8_linears(model)]
    depth, widest = len(linears), max(m.in_features for m in linears)
    return (kl, tpe, *bounds(pair_variance(rollout, train, widest) * depth, s))


@pytest.mark.parametrize("rollout, train", PAIRS)
def test_the_vllm_path_stays_under_the_format_bound(setup, monkeypatch, rollout, train):
    kl, tpe, kl_max, tpe_max = measure(setup, monkeypatch, rollout, train)
    assert 0 <= kl <= kl_max and 1 <= tpe <= tpe_max, (kl, kl_max, tpe, tpe_max)


def test_weights_pushed_from_a_differently_rounded_copy_trip_the_gate(setup, monkeypatch):
    """The push rounds the float32 master to bf16 (the trainer keeps float32): the bf16 pair's
    bound, float32 rounding alone, is far below what that rounding moves."""
    engine = setup[1]
    pushed = engine._weights
    rounded = lambda: ((n, t.to(torch.bfloat16).float()) for n, t in pushed())  # noqa: E731
    monkeypatch.setattr(engine, "_weights", rounded)
    kl, tpe, kl_max, tpe_max = measure(setup, monkeypatch, "bf16", "bf16")
    assert kl > kl_max and tpe > tpe_max, (kl, kl_max, tpe, tpe_max)
    monkeypatch.undo()
    engine.sync_weights()  # the true weights back for any later test
