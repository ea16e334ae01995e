"""The compiled quantizer's keys: one graph per key over the shapes the Trainer and the bench
make, an eager fallback confined to the key that failed, and device errors never swallowed.

Compiled with dynamo's "eager" backend: the same tracing, keys and guards as inductor on the
GPU, without code generation, so these run in seconds on two cores."""

from __future__ import annotations

import warnings

import pytest
import torch

from fp8rl.config import config_from_dict
from fp8rl.fp8 import Fp8Linear, Fp8Recipe, fused
from fp8rl.fp8.kernels import quantize_2d
from fp8rl.train.trainer import Trainer


@pytest.fixture(autouse=True)
def eager_dynamo():
    fused.configure("eager", cpu=True)
    yield
    fused.configure()


def sample(shape, layout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    if layout == "row-major":
        x = torch.randn(m, k, generator=g)
    elif layout == "column-major":
        x = torch.randn(k, m, generator=g).t()
    else:  # a strided slice: neither layout, made contiguous by the quantizer
        x = torch.randn(m, 2 * k, generator=g)[:, ::2]
    return (x * torch.logspace(-2, 2, m)[:, None]).to(dtype)


def assert_same_as_eager(x, granularity, fmt, block):
    data, scale, nonfinite = fused.fused_quantize_2d(x, granularity, fmt, block, False)
    ref_data, ref_scale, ref_nonfinite = quantize_2d(x, granularity, fmt, block, False)
    assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
    assert torch.equal(scale, ref_scale) and bool(nonfinite) == bool(ref_nonfinite)
    assert data.is_contiguous()


def compiles_per_key() -> dict[str, int]:
    report = fused.fused_report()
    assert report, "nothing went through the compiled quantizer"
    assert [r["key"] for r in report if r["fallback"]] == []
    assert all(r["compiles"] is not None for r in report)
    return {r["key"]: r["compiles"] for r in report}


SHAPES = [
    (256, 256),
    (37, 256),
    (130, 768),
    (1, 256),
    (1, 64),
    (64, 64),
    (2, 130),
    (300, 100),
    (1, 1),
]


@pytest.mark.parametrize(
    "granularity,block",
    [
        ("tensorwise", (1, 128)),
        ("rowwise", (1, 128)),
        ("blockwise", (1, 128)),
        ("blockwise", (128, 128)),
    ],
)
def test_odd_and_tiny_shapes_share_one_graph_per_key_and_match_eager(granularity, block):
    for dtype in (torch.bfloat16, torch.float32):
        for i, shape in enumerate(SHAPES):
            for layout in ("row-major", "column-major", "strided"):
                assert_same_as_eager(
                    sample(shape, layout, dtype, seed=i), granularity, "e4m3", block
                )
    counts = compiles_per_key()
    assert len(counts) == 4  # (bf16, fp32) x (row-major, column-major): strided ones are copied
    assert max(counts.values()) <= 2, counts


def test_requires_grad_grad_mode_and_autocast_do_not_recompile_a_key():
    """fmt is part of the key; requires_grad, grad mode and autocast (guards all) are not."""
    x = sample((64, 256), "row-major", torch.bfloat16, seed=0)
    for fmt in ("e4m3", "e5m2", "e4m3"):
        assert_same_as_eager(x.clone().requires_grad_(), "tensorwise", fmt, (1, 128))
        assert_same_as_eager(x, "tensorwise", fmt, (1, 128))
        with torch.no_grad():
            assert_same_as_eager(x, "tensorwise", fmt, (1, 128))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert_same_as_eager(x, "tensorwise", fmt, (1, 128))
    assert sorted(compiles_per_key().values()) == [1, 1]


TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}


def trainer_config(out_dir, rollout: str, train: str, dtype: str) -> dict:
    return {
        "name": "fused-keys",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 32, "test_size": 8},
        },
        "model": {"source": "tiny", "tiny": dict(TINY), "dtype": dtype},
        "rollout": {"precision": rollout, "prompts_per_step": 4, "n": 4, "max_new_tokens": 5},
        "train": {"precision": train, "steps": 2, "lr": 1e-3, "mini_batches": 2},
        "loss": {"mode": "calibrated"},
        "calibration": {"interval": 1, "min_tokens": 2},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 0, "eval_every": 0, "progress": False},
    }


def test_the_trainers_quantizer_calls_compile_at_most_twice_per_key(tmp_path):
    """Two short calibrated runs (rollout, old log-probs, shadow passes, updates with their
    transposed backward operands) in bf16 as on the GPU: every key compiles at most twice."""
    runs = [("fp8-rowwise", "fp8-blockwise"), ("fp8-blockwise", "fp8-tensorwise")]
    for i, (rollout, train) in enumerate(runs):
        rows = Trainer(
            config_from_dict(trainer_config(tmp_path / str(i), rollout, train, "bfloat16"))
        ).fit()
        assert len(rows) == 2
    report = fused.fused_report()
    counts = compiles_per_key()
    assert max(counts.values()) <= 2, counts
    assert {r["granularity"] for r in report} == {"tensorwise", "rowwise", "blockwise"}
    assert {r["layout"] for r in report} == {
        "row-major",
        "column-major",
    }  # the backward's x^T, dy^T
    assert {r["fmt"] for r in report} == {"e4m3", "e5m2"}  # tensorwise output gradients


@pytest.mark.parametrize("m", [37, 130, 1])
def test_fp8_linear_forward_and_backward_at_odd_token_counts(m):
    """Odd M through Fp8Linear (all three GEMM operands) gives what the eager quantizer gives."""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=g).to(torch.bfloat16)
    gy = torch.randn(m, 384, generator=g).to(torch.bfloat16)
    grads = []
    for cpu in (True, False):
        fused.configure("eager", cpu=cpu)
        torch.manual_seed(0)
        lin = torch.nn.Linear(256, 384, dtype=torch.bfloat16)
        layer = Fp8Linear.from_linear(lin, Fp8Recipe.from_name("blockwise"))
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.backward(gy)
        grads.append((y, xi.grad, layer.weight.grad))
        if cpu and m > 1:  # x, W, dy row-major; x^T, dy^T of the grad-weight GEMM column-major
            assert {r["layout"] for r in fused.fused_report()} == {"row-major", "column-major"}
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_a_key_that_fails_to_compile_falls_back_alone(monkeypatch):
    def untraceable(x, fmt, block, pow2):
        torch._dynamo.graph_break()  # fullgraph=True refuses it: a compile failure
        return quantize_2d(x, "blockwise", fmt, block, pow2)

    monkeypatch.setitem(fused._KERNELS, "blockwise", untraceable)
    x = sample((37, 256), "row-major", torch.bfloat16, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_same_as_eager(x, "blockwise", "e4m3", (1, 128))
            assert_same_as_eager(x, "rowwise", "e4m3", (1, 128))
    report = {r["granularity"]: r for r in fused.fused_report()}
    assert report["blockwise"]["fallback"] and report["blockwise"]["calls"] == 1
    assert report["rowwise"]["fallback"] is None and report["rowwise"]["compiles"] == 1
    assert report["rowwise"]["calls"] == 3
    assert len([w for w in caught if "blockwise 1x128" in str(w.message)]) == 1  # warned once
    status = fused.fused_status()
    assert "1 of 2 key(s)" in status and "eager fallback for blockwise 1x128" in status


def test_device_errors_are_raised_not_turned_into_a_fallback():
    x = sample((64, 256), "row-major", torch.float32, seed=4)
    fused.fused_quantize_2d(x, "rowwise", "e4m3", (1, 128), False)
    (variant,) = fused._variants.values()

    def out_of_memory(_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    variant.fn = out_of_memory
    with pytest.raises(torch.OutOfMemoryError):
        fused.fused_quantize_2d(x, "rowwise", "e4m3", (1, 128), False)
    assert variant.fallback is None


def test_configure_switches_the_cpu_path_on_and_off():
    from fp8rl.fp8 import quantize

    x = torch.randn(8, 64)
    quantize(x, "rowwise")
    assert len(fused.fused_report()) == 1 and fused.cpu_path_on()
    fused.configure()
    quantize(x, "rowwise")
    assert fused.fused_report() == [] and fused.fused_status() == "not compiled yet"
