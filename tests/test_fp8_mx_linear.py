"""Fp8Linear with the block-scaled recipes: forward and both gradients against float64 GEMMs
of the fake-quantized operands (MXFP8: every GEMM quantized along its own reduction dim;
MXFP4 / NVFP4: 4-bit forward, straight-through high-precision backward), the weight cache,
non-finite inputs flagged as for FP8, the conversion report, and the SM100 kernel's
argument layout on the meta device."""

import copy

import pytest
import torch
import torch.nn as nn

from fp8rl.config.precision import PRECISIONS, is_quantized, prepare_model, recipe_for
from fp8rl.fp8 import (
    Fp8Linear,
    Fp8Recipe,
    convert_to_fp8,
    fake_quantize,
    quantize,
    quantize_mx,
    record_nonfinite,
    scaled_matmul,
    use_recipe,
)
from fp8rl.fp8.mx_cuda import block_scaled_mm, pack_e2m1, swizzle_scales

CASES = [("mxfp8", {}), ("mxfp8", {"scale_rounding": "rceil"}), ("mxfp4", {}), ("nvfp4", {})]
CASES += [("mxfp4", {"scale_rounding": "rceil"}), ("rowwise", {"hp_backward": True})]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def setup(m=(3, 40), k=96, n=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * k**-0.5)
        lin.bias.copy_(torch.randn(n, generator=g))
    return lin, torch.randn(*m, k, generator=g), torch.randn(*m, n, generator=g)


def references(r: Fp8Recipe, lin, x2, gy2):
    """float64 y, dx, dW from the fake-quantized operands of each GEMM."""
    w = lin.weight.detach()

    def fq(t):  # quantize along the last dim, exact float64 values
        return fake_quantize(t.double(), r)

    y = fq(x2) @ fq(w).T + lin.bias.double()
    if r.hp_backward:
        return y, gy2.double() @ fq(w), gy2.double().T @ fq(x2)
    # dx = dy W: reduce over N (dy's rows, W's columns); dW = dy^T x: reduce over the tokens
    return y, fq(gy2) @ fq(w.T).T, fq(gy2.T) @ fq(x2.T).T


@pytest.mark.parametrize("name,opts", CASES)
def test_forward_and_grads_equal_float64_gemms_of_the_quantized_operands(name, opts):
    r = Fp8Recipe.from_name(name, **opts)
    lin, x, gy = setup()
    f = Fp8Linear.from_linear(copy.deepcopy(lin), r)
    xg = x.clone().requires_grad_()
    y = f(xg)
    y.backward(gy)
    want = references(r, lin, x.reshape(-1, 96), gy.reshape(-1, 160))
    got = (y.reshape(-1, 160), xg.grad.reshape(-1, 96), f.weight.grad)
    for g, w, what in zip(got, want, ("y", "dx", "dW"), strict=True):
        assert rel(g, w) < 1e-6, (what, rel(g, w))  # float32 accumulation only
    assert torch.allclose(f.bias.grad, gy.sum((0, 1)), rtol=1e-5, atol=1e-4)
    # and it is quantized: off the float64 layer by the format's noise
    ref = lin.double()(x.double())
    bound = 0.2 if r.fwd_fmt == "e2m1" else 0.06
    assert 1e-3 < rel(y, ref) < bound


def test_mxfp8_backward_requantizes_along_the_new_reduction_dim():
    """The transposed forward cast is a different GEMM operand: the backward must not reuse it."""
    lin, x, gy = setup(m=(64,))
    f = Fp8Linear.from_linear(lin, "mxfp8")
    f(x).backward(gy)
    assert torch.equal(
        f.weight.grad, scaled_matmul(quantize_mx(gy.T, "mxfp8"), quantize_mx(x.T, "mxfp8"))
    )
    reused = fake_quantize(x, "mxfp8").T.double()
    assert rel(f.weight.grad, fake_quantize(gy.T, "mxfp8").double() @ reused.T) > 1e-4


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4"])
def test_weight_cache_quantizes_once_per_weight_version(name):
    lin, x, _ = setup()
    f = Fp8Linear.from_linear(lin, name)
    with torch.no_grad():
        y1 = f(x)
        assert torch.equal(f(x), y1)
    opt = torch.optim.SGD(f.parameters(), lr=1e-2)
    f(x).square().mean().backward()
    assert f.weight_quantizations == 1
    opt.step()
    with torch.no_grad():
        y2 = f(x)
        f(x)
    assert f.weight_quantizations == 2 and not torch.equal(y1, y2)
    with torch.no_grad(), use_recipe(f, "rowwise"):
        f(x)
    with torch.no_grad():
        assert torch.equal(f(x), y2)  # keyed by recipe: back to this one, quantized again
    assert f.weight_quantizations == 4
    fresh = Fp8Linear.from_linear(copy.deepcopy(lin), name)
    with torch.inference_mode():
        fresh(x)
    fresh(x).sum().backward()  # a cache filled under inference_mode is not saved for backward
    assert fresh.weight_quantizations == 2 and fresh.weight.grad is not None


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4"])
def test_non_finite_input_and_gradient_are_flagged_like_fp8(name):
    lin, x, gy = setup()
    f = Fp8Linear.from_linear(lin, name)
    f.label = "model.layers.0.mlp.up_proj"
    bad = x.clone()
    bad[0, 3, 7] = float("inf")
    with pytest.raises(FloatingPointError, match=r"up_proj: Fp8Linear input \(shape"):
        f(bad)
    y = f(x.clone().requires_grad_())
    with pytest.raises(FloatingPointError, match="up_proj: Fp8Linear grad_output"):
        y.backward(torch.full_like(y, float("nan")))
    with record_nonfinite() as log:
        xg = bad.clone().requires_grad_()
        out = f(xg)
        out.backward(gy)
    assert log[0].startswith("model.layers.0.mlp.up_proj: Fp8Linear input")
    assert not torch.isfinite(out).all() and not torch.isfinite(f.weight.grad).all()
    unchecked = Fp8Linear.from_linear(lin, Fp8Recipe.from_name(name, check_finite=False))
    assert not torch.isfinite(unchecked(bad)).all()  # NaN flows on: never a finite wrong value


def test_nvfp4_tokens_depend_on_their_batch_and_mx_tokens_do_not():
    """NVFP4's tensor scale spans every token of the micro-batch, as tensorwise scales do."""
    lin, x, _ = setup(m=(8,))
    other = torch.cat([x[:4], x[4:] * 50])
    for name, batch_dependent in (("mxfp8", False), ("mxfp4", False), ("nvfp4", True)):
        f = Fp8Linear.from_linear(lin, name)
        with torch.no_grad():
            same = torch.equal(f(x)[:4], f(other)[:4])
        assert same != batch_dependent, name


def test_conversion_report_states_each_gemms_precision_and_alignment():
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 48))
    report = convert_to_fp8(model, "nvfp4")
    text = str(report)
    assert report.converted == ["0"] and "2" in report.skipped and "multiples of 32" in text
    assert report.gemms["forward"] == "nvfp4"
    assert "grad input high precision (float32) on the dequantized forward operands" in text
    m8 = str(convert_to_fp8(nn.Sequential(nn.Linear(64, 96)), "mxfp8"))
    assert "forward mxfp8 floor; grad input mxfp8 floor; grad weight mxfp8 floor" in m8


def test_precision_names_and_the_conversion_of_mixed_phases():
    assert {"mxfp8", "mxfp4", "nvfp4", "fp8-rowwise", "bf16"} <= set(PRECISIONS)
    assert [is_quantized(p) for p in ("mxfp8", "nvfp4", "fp8-blockwise", "bf16", "fp32")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert recipe_for("nvfp4", check_finite=False) == Fp8Recipe.from_name(
        "nvfp4", check_finite=False
    )
    from fp8rl.models import tiny_qwen3

    # the largest alignment decides: nvfp4's 32 over blockwise's 16 (ragged blocks are fine)
    for rollout, train, want in (
        ("fp8-blockwise", "nvfp4", "nvfp4"),
        ("nvfp4", "fp8-blockwise", "nvfp4"),
        ("fp8-rowwise", "mxfp4", "mxfp4"),
        ("bf16", "mxfp8", "mxfp8"),
    ):
        report = prepare_model(tiny_qwen3(), rollout, train)
        assert report.recipe.name == want, (rollout, train)


# --- the SM100 path, checked without the GPU -------------------------------------------------


def test_swizzled_scales_equal_torchao_to_blocked():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.utils import to_blocked

    for rows, cols in ((128, 4), (130, 3), (300, 9), (1, 1)):
        s = torch.randint(0, 255, (rows, cols), dtype=torch.uint8)
        assert torch.equal(swizzle_scales(s), to_blocked(s).flatten())


def test_packed_e2m1_codes_equal_ml_dtypes():
    md = pytest.importorskip("ml_dtypes")
    import numpy as np

    v = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32)
    v = torch.cat([v, -v]).repeat(3)[torch.randperm(48, generator=torch.Generator().manual_seed(0))]
    packed = pack_e2m1(v.reshape(2, 24).to(torch.float8_e4m3fn)).view(torch.uint8)
    codes = v.numpy().astype(md.float4_e2m1fn).view(np.uint8).reshape(2, 24)
    want = codes[:, 0::2] | (codes[:, 1::2] << 4)
    assert np.array_equal(packed.numpy(), want)


# Not MXFP4: torch 2.13's meta rule for it counts scale blocks over the packed K (K / 2
# bytes), unlike its NVFP4 rule and cuBLAS's one scale per 32 elements, so it cannot judge.
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("m,k,n", [(130, 96, 64), (37, 200, 48), (256, 256, 256)])
def test_block_scaled_kernel_arguments_pass_torchs_cuda_checks_on_meta(fmt, m, k, n):
    a, b = quantize_mx(torch.randn(m, k), fmt), quantize_mx(torch.randn(n, k), fmt)
    out = block_scaled_mm(a.to("meta"), b.to("meta"), torch.bfloat16)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16


def test_scaled_matmul_refuses_mixed_operands():
    a8, a4 = quantize_mx(torch.randn(4, 64), "mxfp8"), quantize_mx(torch.randn(4, 64), "mxfp4")
    with pytest.raises(ValueError, match=r"a \(mxfp8\) and b \(mxfp4\)"):
        scaled_matmul(a8, a4)
    with pytest.raises(ValueError, match=r"a \(mxfp8\) and b \(fp8 rowwise\)"):
        scaled_matmul(a8, quantize(torch.randn(4, 64), "rowwise"))
