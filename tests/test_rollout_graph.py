"""Static (graph-shaped) decoding against the eager engine, and when a graph must be re-captured.

No GPU in CI: `FakeGraphs` stands in for `CudaGraphs`. It replays the captured step
eagerly, but fails where a real CUDA graph would read stale memory: a replay that finds a
parameter moved, or an FP8 layer needing a fresh quantization, would have used the old
tensors the graph recorded.
"""

import contextlib

import pytest
import torch

from fp8rl.fp8 import convert_to_fp8
from fp8rl.models import tiny_qwen3
from fp8rl.rollout import (
    RolloutEngine,
    SamplingParams,
    StaticDecoder,
    compute_log_probs,
    sample_next,
)
from fp8rl.rollout.graph_decode import WeightPins
from fp8rl.rollout.requantization import quantization_count, use_recipe
from fp8rl.rollout.sampling import sample_with_noise

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19]]
FIELDS = (
    "response_ids",
    "response_mask",
    "truncated",
    "response_lengths",
    "prompt_ids",
    "prompt_mask",
)


def make_model(recipe=None):
    model = tiny_qwen3(seed=0, initializer_range=0.1).eval()
    if recipe is not None:
        convert_to_fp8(model, recipe)
    return model


@pytest.fixture(scope="module")
def model():
    return make_model()


class FakeGraphs:
    """CPU stand-in for `CudaGraphs` that checks every replay reads what was captured."""

    def __init__(self, model):
        self.model, self.replays = model, 0

    def warmup(self):
        return contextlib.nullcontext()

    def capture(self, step):
        model = self.model
        addresses = [p.data_ptr() for p in model.parameters()]

        def replay():
            assert [p.data_ptr() for p in model.parameters()] == addresses, (
                "replay after a storage swap"
            )
            before = quantization_count(model)
            step()
            assert quantization_count(model) == before, "replay with a stale quantized weight"
            self.replays += 1

        return replay


def engines(model, recipe=None, eos=(), check_every=3, bucket=8):
    """The eager engine, and a static one whose decoder captures and replays through FakeGraphs."""
    kw = dict(recipe=recipe, pad_token_id=0, eos_token_id=list(eos))
    eager = RolloutEngine(model, decode="eager", **kw)
    static = RolloutEngine(model, decode="static", **kw)
    graphs = FakeGraphs(model)
    static._decoders["static"] = StaticDecoder(
        model, graphs=graphs, check_every=check_every, bucket=bucket
    )
    return eager, static, graphs


def assert_same(a, b, exact_lp=False):
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    tol = 0 if exact_lp else 1e-5
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=tol, rtol=0)
    torch.testing.assert_close(a.entropy, b.entropy, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=9),
        SamplingParams(greedy=True, temperature=0.7, max_new_tokens=9),
        SamplingParams(temperature=1.0, max_new_tokens=9),
        SamplingParams(temperature=0.8, top_p=0.6, max_new_tokens=9),
    ],
)
def test_sample_with_given_noise_is_sample_next(params):
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 3
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    noise = None if params.is_greedy else torch.empty(5, 64).exponential_(generator=g2)
    for a, b in zip(
        sample_next(logits, params, g1), sample_with_noise(logits, params, noise), strict=True
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=12),
        SamplingParams(n=3, temperature=1.0, max_new_tokens=12),
        SamplingParams(n=2, temperature=0.7, top_p=0.8, max_new_tokens=12),
    ],
)
@pytest.mark.parametrize("bucket", [1, 8])
def test_static_decode_equals_the_eager_engine(model, params, bucket):
    # an EOS that some rows hit and others don't: finished rows stay in the batch, masked
    eager, static, graphs = engines(model, eos=(21, 40), bucket=bucket)
    ga, gb = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    a = eager.generate(PROMPTS, params, generator=ga)
    b = static.generate(PROMPTS, params, generator=gb)
    assert_same(a, b, exact_lp=bucket == 1)  # the eager cache length: bit-identical
    if not params.is_greedy:  # (greedy stopping: test_early_stop_...)
        assert not b.truncated.all() and b.truncated.any()  # some rows stopped, others ran on
    assert graphs.replays > 0
    assert torch.equal(ga.get_state(), gb.get_state())  # overshoot past the last EOS rewound
    if params.temperature > 0 and params.top_p == 1.0:  # top-p: the trainer's differ by design
        with torch.no_grad():  # and the recorded log-probs are the trainer's
            lp, ent = compute_log_probs(model, b, temperature=b.temperature, with_entropy=True)
        torch.testing.assert_close(lp, b.log_probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, b.entropy, atol=1e-5, rtol=0)


def test_early_stop_and_finished_rows_keep_their_shape(model):
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    free = RolloutEngine(model, decode="eager", pad_token_id=0, eos_token_id=[]).generate(
        PROMPTS, greedy
    )
    eos = [
        int(free.response_ids[r, 2 + r % 3]) for r in range(len(PROMPTS))
    ]  # every row stops by step 4
    eager, static, graphs = engines(model, eos=eos, check_every=4)
    a, b = eager.generate(PROMPTS, greedy), static.generate(PROMPTS, greedy)
    assert_same(a, b)
    assert b.response_ids.shape[1] < 10 and not b.truncated.any()
    assert (b.log_probs[~b.response_mask] == 0).all() and (
        b.response_ids[~b.response_mask] == 0
    ).all()


def test_buffers_and_graph_are_reused_and_results_are_copies(model):
    eager, static, graphs = engines(model)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8)
    first = static.generate(PROMPTS, params, generator=torch.Generator().manual_seed(0))
    kept = first.response_ids.clone()
    second = static.generate(PROMPTS[::-1], params, generator=torch.Generator().manual_seed(1))
    dec = static._decoders["static"]
    assert (dec.allocations, dec.captures) == (1, 1)  # same batch and bucketed width
    assert torch.equal(first.response_ids, kept)  # not overwritten by the second call
    assert_same(
        second, eager.generate(PROMPTS[::-1], params, generator=torch.Generator().manual_seed(1))
    )
    static.generate(
        PROMPTS[:2], params, generator=torch.Generator().manual_seed(1)
    )  # new batch size
    assert (dec.allocations, dec.captures) == (2, 2)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_fp8_graph_is_recaptured_after_a_weight_update(recipe):
    model = make_model(recipe)
    # bucket=1: the eager engine's cache length, so the same float rounding; a longer
    # cache can move an activation by an ulp, and FP8 rounding can turn that into a step
    eager, static, graphs = engines(model, recipe=recipe, bucket=1)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8)
    dec = static._decoders["static"]

    def compare(seed):
        a = eager.generate(PROMPTS, params, generator=torch.Generator().manual_seed(seed))
        b = static.generate(PROMPTS, params, generator=torch.Generator().manual_seed(seed))
        assert_same(a, b, exact_lp=True)
        return b

    before = compare(0)
    compare(1)
    assert (dec.captures, dec.invalidations) == (1, 0)  # unchanged weights: the graph is reused
    with torch.no_grad():  # an optimizer step: in place, the version counters move
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(1.1)
    after = compare(0)  # FakeGraphs would fail on a replay of the stale graph
    assert (dec.captures, dec.invalidations) == (2, 1)
    assert not torch.equal(after.log_probs, before.log_probs)


def test_high_precision_graph_reads_in_place_updates_live():
    model = make_model()
    eager, static, graphs = engines(model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    dec = static._decoders["static"]
    static.generate(PROMPTS, params)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3.0)
    assert_same(eager.generate(PROMPTS, params), static.generate(PROMPTS, params))
    assert dec.captures == 1  # same storage: nothing to re-capture
    w = model.model.layers[0].mlp.up_proj.weight
    w.data = w.data.clone()  # a storage swap (load_state_dict(assign=True) does the same)
    assert_same(eager.generate(PROMPTS, params), static.generate(PROMPTS, params))
    assert (dec.captures, dec.invalidations) == (2, 1)


def test_weight_pins_see_requantization_but_not_reads():
    model = make_model("rowwise")
    with torch.no_grad(), use_recipe(model, "rowwise"):
        pins = WeightPins(model)
        count = quantization_count(model)
        assert pins.valid_for(model) and quantization_count(model) == count
        layer = model.model.layers[1].self_attn.o_proj
        layer.weight.add_(0.0)  # a no-op write still bumps the version: re-quantized, a new tensor
        assert not pins.valid_for(model)
        assert quantization_count(model) == count + 1  # done here, outside any graph
        assert WeightPins(model).valid_for(model)


def test_decode_modes():
    model = make_model("rowwise")
    with pytest.raises(ValueError, match="decode"):
        RolloutEngine(model, recipe="rowwise", decode="fast")
    eng = RolloutEngine(model, recipe="rowwise", decode="graph", pad_token_id=0)
    with pytest.raises(ValueError, match="CUDA"):
        eng.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert RolloutEngine(model, recipe="rowwise").decode_mode() == "static"  # auto on the CPU
    # a capture cannot host-sync per quantization: the graph path relaxes the check
    assert eng._run_recipe("graph").check_finite is False and eng._run_recipe("static").check_finite


def test_non_finite_log_probs_are_reported():
    model = make_model()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    dec = StaticDecoder(model)
    with torch.no_grad(), pytest.raises(FloatingPointError, match="non-finite"):
        dec.run(
            torch.tensor([[3, 4]]),
            torch.ones(1, 2, dtype=torch.bool),
            SamplingParams(max_new_tokens=3),
            torch.Generator().manual_seed(0),
            eos_ids=(),
            pad_id=0,
            vocab=model.config.vocab_size,
            check_finite=True,
        )
