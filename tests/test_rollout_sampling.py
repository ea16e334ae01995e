"""sample_next and token_log_probs against hand computations on a small vocabulary."""

import math

import pytest
import torch

from fp8rl.rollout import SamplingParams, sample_next, token_log_probs

PROBS = [0.5, 0.3, 0.15, 0.05]


def _logits(rows: int) -> torch.Tensor:
    return torch.tensor(PROBS).log().expand(rows, -1).clone()


def test_top_p_records_the_renormalized_nucleus():
    # mass before token 1 is 0.5 < 0.7, before token 2 it is 0.8 >= 0.7: nucleus {0, 1}
    gen = torch.Generator().manual_seed(0)
    tokens, logp, ent = sample_next(_logits(4000), SamplingParams(top_p=0.7), gen)
    assert set(tokens.tolist()) <= {0, 1}
    nucleus = {0: 0.5 / 0.8, 1: 0.3 / 0.8}
    expected = torch.tensor([math.log(nucleus[t]) for t in tokens.tolist()])
    torch.testing.assert_close(logp, expected, atol=1e-6, rtol=0)
    h = -sum(p * math.log(p) for p in nucleus.values())
    torch.testing.assert_close(ent, torch.full_like(ent, h), atol=1e-6, rtol=0)
    frac0 = (tokens == 0).float().mean().item()
    assert abs(frac0 - nucleus[0]) < 0.03


def test_temperature_sampling_matches_the_tempered_distribution():
    temp = 0.5
    q = [p ** (1 / temp) for p in PROBS]
    q = [x / sum(q) for x in q]
    gen = torch.Generator().manual_seed(1)
    tokens, logp, ent = sample_next(_logits(20000), SamplingParams(temperature=temp), gen)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freq, torch.tensor(q), atol=0.015, rtol=0)
    torch.testing.assert_close(logp, torch.tensor(q).log()[tokens], atol=1e-6, rtol=0)
    h = -sum(x * math.log(x) for x in q)
    torch.testing.assert_close(ent, torch.full_like(ent, h), atol=1e-6, rtol=0)


def test_greedy_takes_argmax_and_scores_at_temperature_one():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    tokens, logp, _ = sample_next(logits, SamplingParams(temperature=0, top_p=0.1))
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logp, logits.log_softmax(-1)[[0, 1], [1, 0]])


def test_same_generator_seed_same_tokens():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3))
    a = sample_next(logits, SamplingParams(), torch.Generator().manual_seed(7))[0]
    b = sample_next(logits, SamplingParams(), torch.Generator().manual_seed(7))[0]
    c = sample_next(logits, SamplingParams(), torch.Generator().manual_seed(8))[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_token_log_probs_against_log_softmax(chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, dtype=torch.bfloat16)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    lp, ent = token_log_probs(logits, targets, 0.8, with_entropy=True, chunk=chunk)
    ref = (logits.double() / 0.8).log_softmax(-1)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(
        lp.double(), ref.gather(-1, targets[..., None]).squeeze(-1), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(ent.double(), -(ref.exp() * ref).sum(-1), atol=1e-5, rtol=0)
