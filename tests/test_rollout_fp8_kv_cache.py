"""The FP8 KV cache (`rollout.kv_cache: fp8`): e4m3 round trip within the format's bound,
the same batch in eager and static decoding, scales recalibrated after every weight change,
config errors, and a couple of training steps end to end. The mismatch it adds is gated in
tests/test_mismatch_gates.py."""

import pytest
import torch

from fp8rl.config import load_config
from fp8rl.errors import ConfigError
from fp8rl.models.tiny import tiny_qwen3
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.rollout.fp8_kv_cache import MARGIN, dequantize_kv, kv_amax, quantize_kv

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13]]
PARAMS = SamplingParams(n=2, max_new_tokens=8)


def generate(engine, seed=0):
    return engine.generate(PROMPTS, PARAMS, generator=torch.Generator().manual_seed(seed))


def test_round_trip_within_half_an_e4m3_step_of_the_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 32, 16, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 500.0]).view(
        1, 4, 1, 1
    )
    scale = x.abs().amax(dim=(0, 2, 3)) * MARGIN / 448
    data = quantize_kv(x, scale)
    assert data.dtype == torch.uint8 and data.shape == x.shape  # one byte per element
    back = dequantize_kv(data, scale, torch.float32)
    s = scale.view(1, 4, 1, 1)
    # e4m3: 3 mantissa bits, half a step is 2^-4 relative in the normal range (|x|/s >= 2^-6);
    # below it the subnormal step is 2^-9 of the scale
    bound = torch.maximum(x.abs() * 2.0**-4, s * 2.0**-10)
    assert bool(((back - x).abs() <= bound).all())
    # per head: each head's largest value sits at 448 / MARGIN of its own scale
    assert torch.allclose((back.abs() / s).amax(dim=(0, 2, 3)), torch.full((4,), 224.0), rtol=0.07)


def test_scales_are_per_head_amax_times_margin_over_448():
    model = tiny_qwen3(seed=0)
    engine = RolloutEngine(model, eos_token_id=[], kv_cache="fp8")
    ids = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    mask = torch.tensor([[False, True, True, True], [True] * 4])
    engine.calibrate_kv(ids, mask)
    with torch.no_grad():
        amax = kv_amax(model, ids, mask)
    n_layers, n_kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    assert sorted(engine.kv_scales.keys) == list(range(n_layers))
    assert sorted(amax) == list(range(n_layers))
    for layer, (k, v) in amax.items():
        assert k.shape == (n_kv,) and v.shape == (n_kv,)
        assert torch.equal(engine.kv_scales.keys[layer], k * MARGIN / 448)
        assert torch.equal(engine.kv_scales.values[layer], v * MARGIN / 448)


def test_eager_and_static_decoding_give_the_same_batch_and_differ_from_the_model_dtype():
    model = tiny_qwen3(seed=0)
    eager = generate(RolloutEngine(model, eos_token_id=[], decode="eager", kv_cache="fp8"))
    static = generate(RolloutEngine(model, eos_token_id=[], decode="static", kv_cache="fp8"))
    plain = generate(RolloutEngine(model, eos_token_id=[], decode="static"))
    assert torch.equal(eager.response_ids, static.response_ids)
    assert torch.equal(eager.log_probs, static.log_probs)
    diff = (static.log_probs - plain.log_probs).abs().max()
    assert 0 < diff < 0.1, diff


def test_scales_recalibrate_after_a_weight_change_and_only_then():
    model = tiny_qwen3(seed=0)
    engine = RolloutEngine(model, eos_token_id=[], kv_cache="fp8")
    generate(engine)
    first_v = {i: s.clone() for i, s in engine.kv_scales.values.items()}
    generate(engine, seed=1)
    assert engine.kv_scales.calibrations == 1  # same weights: the scales stand
    with torch.no_grad():  # an in-place push that makes every value 4x larger
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.mul_(4.0)
    generate(engine)
    assert engine.kv_scales.calibrations == 2
    # layer 0's values are exactly 4x; the later layers' inputs moved too
    assert torch.allclose(engine.kv_scales.values[0], 4 * first_v[0], rtol=1e-5)
    for i, s in engine.kv_scales.values.items():
        assert not torch.allclose(s, first_v[i], rtol=0.5), i
    # writes through .data move no version counter: sync_weights(force=True) marks them stale
    for layer in model.model.layers:
        layer.self_attn.v_proj.weight.data.mul_(0.5)
    engine.sync_weights(force=True)
    generate(engine)
    assert engine.kv_scales.calibrations == 3
    assert torch.allclose(engine.kv_scales.values[0], 2 * first_v[0], rtol=1e-5)


def test_bad_kv_cache_values_are_one_line_errors():
    with pytest.raises(ValueError, match="kv_cache = 'int8' must be one of"):
        RolloutEngine(tiny_qwen3(seed=0), kv_cache="int8")
    with pytest.raises(ValueError, match="kv_cache = 'model'"):
        RolloutEngine(tiny_qwen3(seed=0)).calibrate_kv(torch.zeros(1, 2).long(), torch.ones(1, 2))
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["rollout.kv_cache=int8"])
    assert e.value.key == "rollout.kv_cache" and "['model', 'fp8']" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["rollout.engine=vllm", "rollout.kv_cache=fp8"])
    assert e.value.key == "rollout.kv_cache" and "not supported there yet" in str(e.value)
    assert load_config().rollout.kv_cache == "model"


def test_training_runs_with_an_fp8_kv_cache():
    from helpers_step import parity_reward, step_context, step_rows

    ctx = parity_reward(step_context(rollout={"kv_cache": "fp8"}))
    rows = step_rows(ctx, 2)
    assert len(rows) == 2
    assert ctx.engine.kv_cache == "fp8"
    assert ctx.engine.kv_scales.calibrations >= 2  # once per step: the weights moved
    for r in rows:
        assert 0 < r["mismatch/kl_rollout_train"] < 1e-2, r["mismatch/kl_rollout_train"]
