"""Top-p and the trainer: the rollout records each token's full-softmax log-prob beside the
nucleus one, so TIS and the mismatch metrics compare like with like (docs/rollout.md)."""

import pytest
import torch

from fp8rl.config import RolloutConfig
from fp8rl.config.precision import prepare_model, recipe_for
from fp8rl.errors import ConfigError
from fp8rl.fp8 import use_recipe
from fp8rl.models.tiny import tiny_qwen3
from fp8rl.rl import k3_kl, tis_weights, token_prob_error
from fp8rl.rollout import RolloutBatch, RolloutEngine, SamplingParams, compute_log_probs
from fp8rl.rollout.sampling import sample_next


def test_sample_next_returns_the_full_softmax_log_prob_of_the_sampled_token():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=0.7, top_p=0.6)
    gen = torch.Generator().manual_seed(1)
    tokens, lp, _, full = sample_next(logits, params, gen, with_full=True)
    want = (logits / 0.7).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(full, want, rtol=0, atol=1e-5)
    assert (lp >= full - 1e-6).all() and (lp > full + 1e-3).any()  # the nucleus mass is < 1
    # without top-p the two are the very same numbers
    _, lp1, _, full1 = sample_next(logits, SamplingParams(), gen, with_full=True)
    assert full1 is lp1


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(seed=0)


PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_high_precision_rollout_and_trainer_agree_at_top_p(model, decode):
    params = SamplingParams(n=4, top_p=0.8, max_new_tokens=8)
    engine = RolloutEngine(model, decode=decode, eos_token_id=[5])
    batch = engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(3))
    assert batch.top_p == 0.8 and batch.full_log_probs is not batch.log_probs
    with torch.no_grad():
        trainer, _ = compute_log_probs(model, batch, temperature=batch.temperature)
    mask = batch.response_mask
    assert float(k3_kl(batch.comparable_log_probs, trainer, mask)) <= 1e-6
    w, metrics = tis_weights(trainer, batch.comparable_log_probs, mask)
    assert abs(float(metrics["actor/tis_raw_weight_mean"]) - 1) <= 1e-3
    assert float(token_prob_error(batch.comparable_log_probs, trainer, mask)) - 1 <= 1e-3
    # what the nucleus log-probs would have reported: the truncation, as if it were error
    assert float(k3_kl(batch.log_probs, trainer, mask)) > 1e-3
    assert (batch.full_log_probs[~mask] == 0).all()


def test_eager_and_static_decoding_record_the_same_full_log_probs(model):
    params = SamplingParams(n=2, top_p=0.7, max_new_tokens=6)
    a, b = (
        RolloutEngine(model, decode=d, eos_token_id=[5]).generate(
            PROMPTS, params, generator=torch.Generator().manual_seed(4)
        )
        for d in ("eager", "static")
    )
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.full_log_probs, b.full_log_probs)


def test_fp8_mismatch_at_top_p_measures_the_precision_only():
    """An FP8 rollout against a high-precision trainer: the same weights, a big batch; the
    mismatch at top_p 0.8 is within 20 % of the one at top_p 1."""
    model = tiny_qwen3(seed=0)
    prepare_model(model, "fp8-rowwise", "bf16")
    engine = RolloutEngine(model, recipe=recipe_for("fp8-rowwise"), eos_token_id=[])
    prompts = [[i % 64, (3 * i) % 64, (7 * i + 1) % 64] for i in range(32)]
    kl = {}
    for top_p in (1.0, 0.8):
        batch = engine.generate(
            prompts,
            SamplingParams(n=4, top_p=top_p, max_new_tokens=16),
            generator=torch.Generator().manual_seed(5),
        )
        with torch.no_grad(), use_recipe(model, None):
            trainer, _ = compute_log_probs(model, batch, temperature=batch.temperature)
        kl[top_p] = float(k3_kl(batch.comparable_log_probs, trainer, batch.response_mask))
    assert kl[1.0] > 1e-5  # FP8 is visible
    assert abs(kl[0.8] / kl[1.0] - 1) <= 0.2, kl


def test_the_trainer_reports_no_mismatch_for_bf16_at_top_p():
    from helpers_step import parity_reward, step_context, step_rows

    ctx = step_context(
        rollout={"precision": "bf16", "top_p": 0.8, "n": 4, "max_new_tokens": 8},
        train={"precision": "bf16", "steps": 1},
        loss={"mode": "grpo", "dynamic_sampling": False},
    )
    (row,) = step_rows(parity_reward(ctx))
    assert row["mismatch/kl_rollout_train"] <= 1e-6
    assert abs(row["actor/tis_weight_mean"] - 1) <= 1e-3
    assert abs(row["mismatch/token_prob_error"] - 1) <= 1e-3


def _batch(top_p=1.0, full=None, width=3):
    b = 2
    return RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long),
        prompt_mask=torch.ones(b, 2, dtype=torch.bool),
        response_ids=torch.ones(b, width, dtype=torch.long),
        response_mask=torch.ones(b, width, dtype=torch.bool),
        log_probs=torch.full((b, width), -0.5),
        entropy=torch.zeros(b, width),
        truncated=torch.zeros(b, dtype=torch.bool),
        response_lengths=torch.full((b,), width),
        prompt_index=torch.arange(b),
        top_p=top_p,
        full_log_probs=full,
    )


def test_batch_carries_the_full_log_probs_through_select_concat_and_to():
    full = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    b = _batch(0.9, full)
    assert torch.equal(b.select([1]).full_log_probs, full[1:])
    assert torch.equal(b.select(torch.tensor([True, False])).full_log_probs, full[:1])
    assert torch.equal(b.to("cpu").full_log_probs, full)
    c = RolloutBatch.concat([b, _batch(0.9, torch.zeros(2, 2), width=2)])
    assert c.full_log_probs.shape == (4, 3) and c.top_p == 0.9
    assert torch.equal(c.full_log_probs[2:, 2], torch.zeros(2))
    untruncated = _batch()
    assert untruncated.comparable_log_probs is untruncated.log_probs
    with pytest.raises(ValueError, match="top_p differs"):
        RolloutBatch.concat([b, _batch()])


def test_a_batch_without_full_log_probs_at_top_p_refuses_tis():
    b = _batch(0.9)
    assert b.full_log_probs is None and b.select([0]).full_log_probs is None
    with pytest.raises(ValueError, match="top_p=0.9 and no full-softmax log-probs"):
        _ = b.comparable_log_probs


def test_vllm_with_top_p_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.top_p") as e:
        RolloutConfig(engine="vllm", top_p=0.95).check()
    assert "\n" not in str(e.value)
    RolloutConfig(engine="vllm", top_p=1.0).check()  # no vLLM import: its options come later
