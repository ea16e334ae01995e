"""compute_log_probs against an unpadded per-row forward, with and without grad."""

import pytest
import torch

from fp8rl.models import tiny_qwen3
from fp8rl.rollout import compute_log_probs

PAD = 0
# (prompt, response, response tokens masked in): row 1 stopped early, row 2 is long
ROWS = [
    ([5, 6, 7], [9, 10, 11, 12], 4),
    ([8], [13, 14, 0, 0], 2),
    ([20, 21, 22, 23, 24], [30, 31, 32, 33], 4),
]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(seed=1, initializer_range=0.1).eval()


def make_batch(rows=ROWS):
    width = max(len(p) for p, _, _ in rows)
    t = max(len(r) for _, r, _ in rows)
    out = {"prompt_ids": [], "prompt_mask": [], "response_ids": [], "response_mask": []}
    for p, r, keep in rows:
        out["prompt_ids"].append([PAD] * (width - len(p)) + p)
        out["prompt_mask"].append([False] * (width - len(p)) + [True] * len(p))
        out["response_ids"].append(r + [PAD] * (t - len(r)))
        out["response_mask"].append([True] * keep + [False] * (t - keep))
    return {k: torch.tensor(v) for k, v in out.items()}


@torch.no_grad()
def reference(model, temperature):
    """Per row: one forward of prompt + kept response, no padding, no mask."""
    lps, ents = [], []
    for p, r, keep in ROWS:
        logits = model(input_ids=torch.tensor([p + r[:keep]])).logits[0, len(p) - 1 : -1].double()
        logp = (logits / temperature).log_softmax(-1)
        lp = logp.gather(-1, torch.tensor(r[:keep])[:, None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        pad = torch.zeros(len(r) - keep, dtype=torch.float64)
        lps.append(torch.cat([lp, pad]))
        ents.append(torch.cat([ent, pad]))
    return torch.stack(lps), torch.stack(ents)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_matches_unpadded_forward(model, temperature, micro_batch_size):
    with torch.no_grad():
        lp, ent = compute_log_probs(
            model,
            make_batch(),
            temperature=temperature,
            micro_batch_size=micro_batch_size,
            with_entropy=True,
        )
    ref_lp, ref_ent = reference(model, temperature)
    assert lp.dtype == torch.float32 and lp.shape == (3, 4)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    assert (lp[1, 2:] == 0).all() and (ent[1, 2:] == 0).all()


def test_keeps_the_graph_for_the_loss(model):
    batch = make_batch()
    lp, ent = compute_log_probs(model, batch, with_entropy=False)
    assert ent is None and lp.requires_grad
    model.zero_grad()
    (-(lp * batch["response_mask"]).sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    model.zero_grad()
    with torch.no_grad():
        assert not compute_log_probs(model, batch)[0].requires_grad


def test_bf16_model_gives_float32(model):
    low = tiny_qwen3(seed=1, initializer_range=0.1, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        lp, _ = compute_log_probs(low, make_batch())
    assert lp.dtype == torch.float32
    ref, _ = reference(model, 1.0)
    assert (lp.double() - ref).abs().max() < 0.1  # same weights, bf16 rounding only


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature = 0.0"),
        (dict(temperature=float("nan")), "temperature = nan"),
        (dict(micro_batch_size=0), "micro_batch_size = 0"),
        (dict(micro_batch_size=1.5), "micro_batch_size = 1.5"),
    ],
)
def test_bad_arguments(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_log_probs(model, make_batch(), **kwargs)


def test_missing_or_inconsistent_fields(model):
    batch = make_batch()
    del batch["response_mask"]
    with pytest.raises(TypeError, match="response_mask"):
        compute_log_probs(model, batch)
    batch = make_batch()
    batch["response_mask"] = batch["response_mask"][:, :2]
    with pytest.raises(ValueError, match="inconsistent shapes"):
        compute_log_probs(model, batch)
