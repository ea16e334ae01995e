"""VllmRolloutEngine against fp8rl's own float64 references: the same RolloutBatch, weights in
step with the trainer, fake-quantized pushes on the CPU. Runs where vLLM is installed
(scripts/check-vllm.sh); one engine is built for the module (each start takes ~20 s)."""

import copy

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/check-vllm.sh")

from _vllm_tiny import tiny_vllm_setup  # noqa: E402
from fp8rl.fp8 import (  # noqa: E402
    Fp8Recipe,
    fake_quantize,
    named_fp8_linears,
    use_recipe,
)
from fp8rl.rollout import SamplingParams  # noqa: E402

PROMPTS = ["1+2=", "7+5=", "3+3=", "9+0="]


@pytest.fixture(scope="module")
def setup():
    return tiny_vllm_setup()


def reference_log_softmax(model, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """float64 log-softmax of a high-precision forward of a float64 copy of the model."""
    ref = copy.deepcopy(model).double()
    with torch.no_grad(), use_recipe(ref, None):
        logits = ref(ids).logits.double()
    return torch.log_softmax(logits / temperature, -1)


def full_rows(batch, r):
    p = batch.prompt_ids[r][batch.prompt_mask[r]]
    t = batch.response_ids[r][batch.response_mask[r]]
    return p, t


def test_batch_has_n_samples_per_prompt_with_the_sampled_distributions_log_probs(setup):
    model, tok, engine = setup
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=6)
    batch = engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(1))
    assert len(batch) == 12 and batch.prompt_index.tolist() == [i // 3 for i in range(12)]
    assert batch.temperature == 0.8
    eos = tok.eos_token_id
    for r in range(len(batch)):
        p, t = full_rows(batch, r)
        n = len(t)
        assert batch.response_mask[r, :n].all() and not batch.response_mask[r, n:].any()
        assert bool(batch.truncated[r]) == (eos not in t.tolist())
        if not batch.truncated[r]:
            assert t[-1] == eos and eos not in t[:-1].tolist()
        else:
            assert n == params.max_new_tokens
        logp = reference_log_softmax(model, torch.cat([p, t])[None], 0.8)[0]
        pos = torch.arange(len(p) - 1, len(p) - 1 + n)
        want = logp[pos, t]
        torch.testing.assert_close(batch.log_probs[r, :n].double(), want, atol=2e-5, rtol=0)
    # the entropy is left to the trainer's old-log-prob pass (tests/test_step_entropy.py)
    assert batch.entropy is None
    assert batch.texts[0] == tok.decode(full_rows(batch, 0)[1].tolist())


def test_the_engine_asks_vllm_for_the_sampled_tokens_log_prob_only(setup):
    _, _, engine = setup
    # a vocabulary's log-probs per token cost a Python object each: 15-30x the rollout
    params = engine._vllm_params(SamplingParams(n=2, temperature=0.7, max_new_tokens=5), 3)
    assert params.logprobs == 0 and params.prompt_logprobs is None
    assert (params.n, params.temperature, params.max_tokens, params.seed) == (2, 0.7, 5, 3)
    assert engine.options.get("max_logprobs") is None  # fp8rl's, set at build (0)
    assert engine.llm.llm_engine.model_config.max_logprobs == 0


def test_top_p_renormalizes_over_the_nucleus(setup):
    model, _, engine = setup
    batch = engine.generate(
        PROMPTS, SamplingParams(n=2, top_p=0.6, max_new_tokens=4), generator=torch.Generator()
    )
    for r in range(len(batch)):
        p, t = full_rows(batch, r)
        logp = reference_log_softmax(model, torch.cat([p, t])[None])[0]
        for k, token in enumerate(t.tolist()):
            lp = logp[len(p) - 1 + k]
            order = lp.argsort(descending=True)
            mass = lp[order].exp().cumsum(0)
            keep = order[: int((mass < 0.6).sum()) + 1]  # smallest set reaching top_p
            assert token in keep.tolist()
            want = lp[token] - torch.logsumexp(lp[keep], 0)
            assert abs(float(batch.log_probs[r, k]) - float(want)) < 2e-5


def test_a_fixed_generator_gives_the_same_rollout(setup):
    _, _, engine = setup
    params = SamplingParams(n=4, max_new_tokens=6)

    def run(seed):
        b = engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(seed))
        return b.response_ids.tolist(), b.log_probs

    (a, la), (b, lb), (c, _) = run(5), run(5), run(6)
    assert a == b and torch.equal(la, lb)
    assert a != c


def test_weights_pushed_after_updates_replace_stale_ones(setup):
    model, _, engine = setup
    seq = [[1, 5, 6, 15, 7, 16, 12, 2]]
    engine.sync_weights()
    before = engine.sequence_log_probs(seq)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for _ in range(3):  # high learning rate: every weight moves well past float noise
        with use_recipe(model, None):
            loss = -torch.log_softmax(model(torch.tensor(seq)).logits, -1)[0, :-1].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    want = reference_log_softmax(model, torch.tensor(seq))[0, :-1].gather(
        1, torch.tensor(seq[0][1:])[:, None]
    )[:, 0]
    stale = engine.sequence_log_probs(seq)[0]
    torch.testing.assert_close(stale, before, atol=0, rtol=0)  # the engine holds its own copy
    seconds = engine.sync_weights()
    now = engine.sequence_log_probs(seq)[0]
    torch.testing.assert_close(now.double(), want, atol=2e-5, rtol=0)
    assert (now - before).abs().max() > 0.05
    assert seconds > 0


def test_sync_if_due_pushes_every_sync_every_steps(setup, monkeypatch):
    _, _, engine = setup
    pushed = []

    def push(step=None):
        pushed.append(step)
        engine.last_sync = step
        return 0.0

    monkeypatch.setattr(engine, "sync_weights", push)
    monkeypatch.setattr(engine, "sync_every", 3)
    monkeypatch.setattr(engine, "last_sync", None)
    for step in range(4, 12):  # a resumed run: its first step pushes, then every 3
        engine.sync_if_due(step)
    assert pushed == [4, 7, 10]


def test_an_fp8_recipe_on_the_cpu_pushes_fake_quantized_weights(setup, monkeypatch):
    model, _, engine = setup
    recipe = Fp8Recipe.from_name("rowwise")
    seq = [[1, 7, 6, 9, 15, 5, 5, 2]]
    target = torch.tensor(seq[0][1:])[:, None]
    monkeypatch.setattr(engine, "recipe", recipe)
    monkeypatch.setattr(engine, "fake_quantized", True)
    assert "fake-quantized" in engine.describe()
    engine.sync_weights()
    got = engine.sequence_log_probs(seq)[0].double()
    fq = copy.deepcopy(model)
    with torch.no_grad():
        for _, m in named_fp8_linears(fq):
            m.weight.copy_(fake_quantize(m.weight, recipe, weight=True))
    want = reference_log_softmax(fq, torch.tensor(seq))[0, :-1].gather(1, target)[:, 0]
    high = reference_log_softmax(model, torch.tensor(seq))[0, :-1].gather(1, target)[:, 0]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert (got - high).abs().max() > 1e-4  # the weights' FP8 error reached the engine
    monkeypatch.undo()
    engine.sync_weights()  # back to high precision for any later test
