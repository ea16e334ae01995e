"""RolloutEngine in high precision against independent references.

The references run the model one unpadded prompt at a time, recomputing the full
forward for every token (no KV cache, no padding, no masks of ours).
"""

import math
import string

import pytest
import torch

from fp8rl.models import tiny_qwen3
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19]]


@pytest.fixture(scope="module")
def model():
    # a larger init than the default gives peaked, varied outputs instead of one repeated token
    return tiny_qwen3(seed=0, initializer_range=0.1).eval()


def engine(model, **kw):
    kw.setdefault("pad_token_id", 0)
    kw.setdefault("eos_token_id", [])
    return RolloutEngine(model, **kw)


@torch.no_grad()
def reference_logits(model, prompt, response) -> torch.Tensor:
    """(len(response), V) logits predicting each response token, from one unpadded forward."""
    seq = torch.tensor([list(prompt) + list(response)])
    return model(input_ids=seq).logits[0, len(prompt) - 1 : -1].double()


@torch.no_grad()
def greedy_reference(model, prompt, steps, eos=()):
    seq, out = list(prompt), []
    for _ in range(steps):
        tok = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(tok)
        seq.append(tok)
        if tok in eos:
            break
    return out


def response(batch, row):
    return batch.response_ids[row, : int(batch.response_lengths[row])].tolist()


def test_greedy_with_cache_equals_full_recompute(model):
    batch = engine(model).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=10))
    for i, p in enumerate(PROMPTS):
        assert response(batch, i) == greedy_reference(model, p, 10)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_sampling_log_probs_equal_a_fresh_forward(model, temperature):
    params = SamplingParams(n=3, temperature=temperature, max_new_tokens=9)
    batch = engine(model).generate(PROMPTS, params, generator=torch.Generator().manual_seed(0))
    assert batch.log_probs.dtype == torch.float32 and batch.temperature == temperature
    with torch.no_grad():
        lp, ent = compute_log_probs(model, batch, temperature=temperature, with_entropy=True)
    torch.testing.assert_close(lp, batch.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, batch.entropy, atol=1e-5, rtol=0)
    for row in range(len(batch)):  # and an independent, unpadded forward per row
        p, r = PROMPTS[int(batch.prompt_index[row])], response(batch, row)
        ref = (reference_logits(model, p, r) / temperature).log_softmax(-1)
        expected = ref.gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        torch.testing.assert_close(
            batch.log_probs[row, : len(r)].double(), expected, atol=1e-5, rtol=0
        )


def test_top_p_log_probs_are_the_renormalized_ones(model):
    top_p, temp = 0.4, 0.8
    params = SamplingParams(n=2, temperature=temp, top_p=top_p, max_new_tokens=5)
    batch = engine(model).generate(PROMPTS[:2], params, generator=torch.Generator().manual_seed(1))
    for row in range(len(batch)):
        p, r = PROMPTS[int(batch.prompt_index[row])], response(batch, row)
        logits = reference_logits(model, p, r) / temp
        for t, tok in enumerate(r):
            probs = logits[t].softmax(-1).tolist()
            order = sorted(range(len(probs)), key=lambda i: -probs[i])
            nucleus, mass = [], 0.0
            for i in order:  # smallest most-likely prefix whose mass reaches top_p
                nucleus.append(i)
                mass += probs[i]
                if mass >= top_p:
                    break
            assert tok in nucleus
            z = sum(probs[i] for i in nucleus)
            assert batch.log_probs[row, t].item() == pytest.approx(
                math.log(probs[tok] / z), abs=1e-5
            )
            h = -sum(probs[i] / z * math.log(probs[i] / z) for i in nucleus)
            assert batch.entropy[row, t].item() == pytest.approx(h, abs=1e-5)


def test_a_prompt_does_not_depend_on_its_batch(model):
    eng = engine(model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    alone = eng.generate([PROMPTS[0]], params)
    mixed = eng.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], params)
    assert response(mixed, 1) == response(alone, 0)
    torch.testing.assert_close(mixed.log_probs[1], alone.log_probs[0], atol=1e-5, rtol=0)
    assert mixed.prompt_ids.shape[1] == len(PROMPTS[1])
    assert mixed.prompt_mask[1].tolist() == [False] * 4 + [True] * 3  # left padded
    assert mixed.prompt_ids[1, :4].tolist() == [0] * 4


def test_eos_stops_a_row_and_is_kept(model):
    free = engine(model).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=10))
    row0 = free.response_ids[0].tolist()
    first = next(k for k in range(2, 10) if row0[k] not in row0[:k])  # a token new at step >= 2
    eos = row0[first]
    batch = engine(model, eos_token_id=eos).generate(
        PROMPTS, SamplingParams(temperature=0, max_new_tokens=10)
    )
    for row, p in enumerate(PROMPTS):
        expected = greedy_reference(model, p, 10, eos=(eos,))
        stop = len(expected)
        assert response(batch, row) == expected
        assert batch.truncated[row].item() == (expected[-1] != eos)
        assert batch.response_mask[row, :stop].all() and not batch.response_mask[row, stop:].any()
        assert (batch.response_ids[row, stop:] == 0).all()
        assert (batch.log_probs[row, stop:] == 0).all() and (batch.entropy[row, stop:] == 0).all()
    assert batch.response_lengths[0] == first + 1 and not batch.truncated[0]
    assert batch.response_ids.shape[1] == int(batch.response_lengths.max())


def test_every_row_stopping_ends_generation_early(model):
    first = engine(model).generate(PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=1))
    eos = first.response_ids[0, 0].item()
    batch = engine(model, eos_token_id=eos).generate(
        PROMPTS[:1], SamplingParams(n=2, temperature=0, max_new_tokens=50)
    )
    assert batch.response_ids.shape == (2, 1)
    assert batch.response_lengths.tolist() == [1, 1] and not batch.truncated.any()


def test_without_eos_every_response_is_truncated_at_max_new_tokens(model):
    batch = engine(model).generate(
        PROMPTS, SamplingParams(n=2, max_new_tokens=6), generator=torch.Generator().manual_seed(0)
    )
    assert batch.truncated.all() and batch.response_lengths.tolist() == [6] * 8
    assert batch.response_mask.all() and batch.response_ids.shape == (8, 6)


def test_rows_layout_and_dtypes(model):
    batch = engine(model).generate(
        PROMPTS, SamplingParams(n=3, max_new_tokens=4), generator=torch.Generator().manual_seed(0)
    )
    assert len(batch) == 12
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for row in range(12):
        p = PROMPTS[row // 3]
        assert batch.prompt_ids[row][batch.prompt_mask[row]].tolist() == p
    assert batch.response_mask.dtype == torch.bool and batch.prompt_mask.dtype == torch.bool
    assert batch.truncated.dtype == torch.bool and batch.response_lengths.dtype == torch.int64
    assert batch.texts is None


def test_same_seed_reproduces_and_the_generator_advances(model):
    eng, params = engine(model), SamplingParams(n=4, max_new_tokens=8)
    a = eng.generate(PROMPTS, params, generator=torch.Generator().manual_seed(123))
    gen = torch.Generator().manual_seed(123)
    b = eng.generate(PROMPTS, params, generator=gen)
    c = eng.generate(PROMPTS, params, generator=gen)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(b.response_ids, c.response_ids)
    # the n samples of a prompt are distinct draws, not copies
    assert not torch.equal(a.response_ids[0], a.response_ids[1])


def test_resuming_from_a_saved_generator_state(model):
    eng, params = engine(model), SamplingParams(n=2, max_new_tokens=6)
    gen = torch.Generator().manual_seed(9)
    eng.generate(PROMPTS, params, generator=gen)
    state = gen.get_state()  # what a checkpoint stores
    first = eng.generate(PROMPTS, params, generator=gen)
    resumed = torch.Generator()
    resumed.set_state(state)
    assert torch.equal(
        eng.generate(PROMPTS, params, generator=resumed).response_ids, first.response_ids
    )


def test_without_a_generator_the_global_seed_decides(model):
    eng, params = engine(model), SamplingParams(n=2, max_new_tokens=6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        a = eng.generate(PROMPTS, params)
        torch.manual_seed(4)
        b = eng.generate(PROMPTS, params)
    assert torch.equal(a.response_ids, b.response_ids)


def test_generate_restores_training_mode(model):
    model.train()
    try:
        engine(model).generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()


def test_string_prompts_with_a_tokenizer(model):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits  # 62 chars: the model's 64 ids all decode
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    assert (
        RolloutEngine(model, hf).eos_token_ids == (1,)
        and RolloutEngine(model, hf).pad_token_id == 0
    )
    assert RolloutEngine(model, hf, eos_token_id=[]).eos_token_ids == ()
    prompts = ["ab12", "Zx9"]
    params = SamplingParams(n=2, temperature=0, max_new_tokens=6)
    free = RolloutEngine(model, hf, eos_token_id=[]).generate(prompts, params)
    assert free.texts[0] == "".join(hf.convert_ids_to_tokens(response(free, 0)))
    eos = free.response_ids[0, 1].item()  # stop row 0 at its second token (or first, if equal)
    batch = RolloutEngine(model, hf, eos_token_id=eos).generate(prompts, params)
    ids = [[vocab[c] for c in p] for p in prompts]
    eos_text = hf.convert_ids_to_tokens(eos)
    for row in range(4):
        assert batch.prompt_ids[row][batch.prompt_mask[row]].tolist() == ids[row // 2]
        generated = hf.convert_ids_to_tokens(free.response_ids[row].tolist())
        stop = generated.index(eos_text) + 1 if eos_text in generated else len(generated)
        assert batch.texts[row] == "".join(generated[:stop])  # up to and including the EOS
    assert batch.texts[0].endswith(eos_text) and len(batch.texts[0]) <= 2


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([], "prompts is empty"),
        ("abc", "list of strings"),
        ([[1, 2], []], r"prompts\[1\] is empty"),
        ([[1, 64]], r"prompts\[0\] has token ids \[64\]"),
        ([[1, -1]], r"prompts\[0\] has token ids \[-1\]"),
        (["ab"], "no tokenizer"),
        ([[1, 2], "ab"], "mix"),
        ([[1.0, 2.0]], r"prompts\[0\]"),
    ],
)
def test_bad_prompts(model, prompts, message):
    with pytest.raises((ValueError, TypeError), match=message):
        engine(model).generate(prompts, SamplingParams(max_new_tokens=2))


def test_bad_engine_arguments(model):
    with pytest.raises(TypeError, match="SamplingParams"):
        engine(model).generate([[1]], {"n": 1})
    with pytest.raises(TypeError, match="generator"):
        engine(model).generate([[1]], SamplingParams(), generator=0)
    with pytest.raises(ValueError, match="eos_token_id = 99"):
        RolloutEngine(model, eos_token_id=99)
    with pytest.raises(ValueError, match="pad_token_id = -1"):
        RolloutEngine(model, pad_token_id=-1)
    with pytest.raises(ValueError, match="no Fp8Linear"):
        RolloutEngine(model, recipe="rowwise")
    with pytest.raises(ValueError, match="unknown recipe name"):
        RolloutEngine(model, recipe="int4")
    with pytest.raises(TypeError, match="recipe=4"):
        RolloutEngine(model, recipe=4)


def first_stop(row: list[int], stops: set[int]) -> list[int]:
    """`row` up to and including its first token in `stops` (all of it when none is)."""
    for k, t in enumerate(row):
        if t in stops:
            return row[: k + 1]
    return row


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_sampling_stops_at_each_eos_the_generation_config_lists(decode):
    model = tiny_qwen3(seed=0, initializer_range=0.1).eval()
    model.config.eos_token_id = None
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)

    def run(**kw):
        gen = torch.Generator().manual_seed(3)
        return RolloutEngine(model, decode=decode, pad_token_id=0, **kw).generate(
            PROMPTS, params, generator=gen
        )

    free = [response(run(eos_token_id=[]), r) for r in range(8)]
    # two ids that end different rows early: each first appears at step >= 1 of its row
    a = next(t for t in free[0][1:] if t not in free[0][:1])
    b = next(t for row in free[1:] for k, t in enumerate(row) if k and t != a and a not in row)
    model.generation_config.eos_token_id = [a, b]
    batch = run()
    assert RolloutEngine(model).eos_token_ids == (a, b)
    stopped = {"a": 0, "b": 0}
    for r in range(8):
        expected = first_stop(free[r], {a, b})
        assert response(batch, r) == expected
        assert bool(batch.truncated[r]) == (expected[-1] not in (a, b))
        stopped["a"] += expected[-1] == a and len(expected) < 12
        stopped["b"] += expected[-1] == b and len(expected) < 12
    assert stopped["a"] >= 1 and stopped["b"] >= 1  # both ids ended a response


def test_eos_ids_are_the_union_of_what_the_model_declares():
    from types import SimpleNamespace

    from fp8rl.rollout.engine import special_token_ids

    model = tiny_qwen3(seed=0)
    model.config.eos_token_id, model.config.pad_token_id = 9, 0
    model.generation_config.eos_token_id = [3, 7]
    tok = SimpleNamespace(eos_token_id=7, pad_token_id=None)
    assert special_token_ids(model, tok, 64) == ((7, 3, 9), 0)
    model.config.pad_token_id = None
    assert special_token_ids(model, tok, 64) == ((7, 3, 9), 7)  # pad falls back to an EOS
    assert special_token_ids(model, tok, 64, eos_token_id=[5]) == ((5,), 5)  # an argument wins
    model.generation_config.eos_token_id = 3  # one id, not a list
    assert special_token_ids(model, None, 64)[0] == (3, 9)
