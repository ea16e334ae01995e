"""scaled_matmul against a float64 product of the dequantized operands; the CUDA call's
argument layouts checked by torch's own _scaled_mm shape/stride rules on the meta device."""

import pytest
import torch

from fp8rl.fp8 import Fp8Tensor, quantize, scaled_matmul
from fp8rl.fp8.matmul import _cuda_scaled_mm, _pad_rows_cols

EPS32 = 2.0**-24


def operands(m, k, n, ga, gb, ba=(1, 128), bb=(128, 128), fa="e4m3", fb="e4m3", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    w = torch.randn(n, k, generator=g) * 0.05
    return quantize(x, ga, fmt=fa, block=ba), quantize(w, gb, fmt=fb, block=bb)


def assert_matches_float64(a, b, out):
    ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64).t()
    # float32: one rounding per dequantized element, K-term accumulation.
    mag = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().t()
    k = a.data.shape[1]
    assert ((out.double() - ref).abs() <= (k + 4) * EPS32 * mag + 1e-30).all()
    assert (
        (out.double() - ref).abs().max() > 0 or ref.abs().max() == 0 or k < 4
    )  # float32 really rounded


@pytest.mark.parametrize(
    "ga,gb,ba,bb,fa,fb",
    [
        ("tensorwise", "tensorwise", (1, 128), (1, 128), "e4m3", "e4m3"),
        ("tensorwise", "tensorwise", (1, 128), (1, 128), "e5m2", "e4m3"),
        ("rowwise", "rowwise", (1, 128), (1, 128), "e4m3", "e4m3"),
        ("blockwise", "blockwise", (1, 128), (128, 128), "e4m3", "e4m3"),
        ("blockwise", "blockwise", (1, 128), (1, 128), "e4m3", "e4m3"),
        ("blockwise", "blockwise", (1, 32), (64, 32), "e4m3", "e5m2"),
        ("rowwise", "tensorwise", (1, 128), (1, 128), "e4m3", "e4m3"),
    ],
)
@pytest.mark.parametrize("mkn", [(64, 256, 384), (37, 300, 130)])
def test_emulation_matches_float64_reference(ga, gb, ba, bb, fa, fb, mkn):
    a, b = operands(*mkn, ga, gb, ba, bb, fa, fb)
    out = scaled_matmul(a, b)
    assert out.shape == (mkn[0], mkn[2]) and out.dtype == torch.float32
    assert_matches_float64(a, b, out)


def test_out_dtype_is_honoured():
    a, b = operands(16, 128, 32, "rowwise", "rowwise")
    out = scaled_matmul(a, b, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, scaled_matmul(a, b).to(torch.bfloat16))


def test_result_close_to_high_precision_product():
    """The point of the exercise: FP8 operands, product within a few percent."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 512, generator=g), torch.randn(256, 512, generator=g)
    ref = x.double() @ w.double().t()
    for gran in ("tensorwise", "rowwise", "blockwise"):
        out = scaled_matmul(quantize(x, gran), quantize(w, gran, block=(128, 128)))
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        assert 1e-3 < rel < 0.05, (gran, rel)


def test_bad_operands():
    a, b = operands(8, 128, 16, "tensorwise", "tensorwise")
    with pytest.raises(ValueError, match="contraction"):
        scaled_matmul(a, quantize(torch.randn(16, 64), "tensorwise"))
    with pytest.raises(TypeError, match="Fp8Tensor"):
        scaled_matmul(a, torch.randn(16, 128))
    with pytest.raises(ValueError, match="2-D"):
        scaled_matmul(quantize(torch.randn(2, 8, 128), "tensorwise"), b)


@pytest.mark.parametrize(
    "gran,block",
    [
        ("tensorwise", (1, 128)),
        ("rowwise", (1, 128)),
        ("blockwise", (1, 128)),
        ("blockwise", (128, 128)),
    ],
)
def test_zero_padding_for_the_kernel_keeps_the_product(gran, block):
    a, _ = operands(37, 200, 8, gran, gran, ba=block)
    _, b = operands(37, 200, 130, gran, gran, bb=block)
    ap, bp = _pad_rows_cols(a, 37, 256), _pad_rows_cols(b, 256, 256)
    assert ap.data.shape == (37, 256) and bp.data.shape == (256, 256)
    # Same exact products (padding adds zeros); only the float32 summation order may differ.
    assert_matches_float64(a, b, scaled_matmul(ap, bp)[:, :130])


def to_meta(t: Fp8Tensor) -> Fp8Tensor:
    return Fp8Tensor(t.data.to("meta"), t.scale.to("meta"), t.granularity, t.block, t.fmt)


@pytest.mark.parametrize(
    "gran,ba,bb,mkn",
    [
        ("tensorwise", (1, 128), (1, 128), (40, 256, 384)),
        ("tensorwise", (1, 128), (1, 128), (40, 200, 300)),  # K, N padded to 16
        ("rowwise", (1, 128), (1, 128), (40, 256, 384)),
        ("rowwise", (1, 128), (1, 128), (40, 200, 300)),
        ("blockwise", (1, 128), (128, 128), (40, 384, 256)),  # 3 K-blocks: scales padded to 4
        ("blockwise", (1, 128), (128, 128), (40, 200, 300)),
        ("blockwise", (1, 128), (1, 128), (256, 640, 128)),  # the grad-weight GEMM shape
    ],
)
def test_cuda_call_layouts_pass_torch_scaled_mm_checks(gran, ba, bb, mkn):
    """On the meta device torch runs the CUDA shape/stride/dtype checks of _scaled_mm
    (row-major a, column-major b, dims % 16, blockwise scale shapes and strides)."""
    a, b = operands(*mkn, gran, gran, ba, bb)
    out = _cuda_scaled_mm(to_meta(a), to_meta(b), torch.float32, False)
    assert out.shape == (mkn[0], mkn[2]) and out.dtype == torch.float32


@pytest.mark.parametrize("m", [37, 130, 1])
def test_cuda_blockwise_call_layouts_for_odd_token_counts(m):
    """The Trainer's token counts are arbitrary: blockwise calls at M = 37, 130, 1 pass the
    meta checks too (a is padded to 16 rows, the result cut back to M)."""
    for bb in ((128, 128), (1, 128)):
        a, b = operands(m, 384, 256, "blockwise", "blockwise", (1, 128), bb)
        out = _cuda_scaled_mm(to_meta(a), to_meta(b), torch.bfloat16, False)
        assert out.shape == (m, 256) and out.dtype == torch.bfloat16


def _cublas_blockwise(a, b, scale_a, recipe_a, scale_b, recipe_b, output_dtype):
    """What cuBLAS computes from F.scaled_mm's blockwise arguments, written from its documented
    scale layouts (not from fp8rl's code): a (M, K) with (M, K/128) scales stored M-major,
    b (K, N) column-major with (L4, N/128) 128x128 scales or (K/128, N)^T 1x128 ones."""
    mp, kp = a.shape
    np_ = b.shape[1]
    assert mp % 16 == 0 and kp % 128 == 0 and np_ % 128 == 0
    assert scale_a.shape == (mp, kp // 128) and scale_a.stride() == (1, mp)
    deq_a = a.double() * scale_a.double().repeat_interleave(128, 1)
    if recipe_b == torch.nn.functional.ScalingType.BlockWise128x128:
        l4 = -(-(kp // 128) // 4) * 4
        assert scale_b.shape == (l4, np_ // 128) and scale_b.stride() == (1, l4)
        sb = scale_b[: kp // 128].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    else:
        assert scale_b.shape == (np_, kp // 128) and scale_b.stride() == (1, np_)
        sb = scale_b.double().t().repeat_interleave(128, 0)
    return (deq_a @ (b.double() * sb)).to(output_dtype)


@pytest.mark.parametrize("m", [37, 130, 1, 256])
@pytest.mark.parametrize("bb", [(128, 128), (1, 128)])
def test_cuda_blockwise_padding_keeps_the_product(monkeypatch, m, bb):
    """_cuda_scaled_mm's padding and cropping, run on the CPU through a stand-in for the kernel."""
    import fp8rl.fp8.matmul as mm

    if not hasattr(torch.nn.functional, "ScalingType"):
        pytest.skip("this torch has no blockwise scaled_mm API")
    monkeypatch.setattr(mm.F, "scaled_mm", _cublas_blockwise)
    a, b = operands(m, 200, 300, "blockwise", "blockwise", (1, 128), bb)
    out = _cuda_scaled_mm(a, b, torch.float32, False)
    assert out.shape == (m, 300)
    assert_matches_float64(a, b, out)


def test_meta_checks_have_teeth():
    """Guard for the test above: a wrong layout is rejected on meta."""
    a, b = operands(40, 256, 256, "tensorwise", "tensorwise")
    one = torch.tensor(1.0, device="meta")
    with pytest.raises(RuntimeError, match="col_major"):
        torch._scaled_mm(
            a.data.to("meta"), b.data.to("meta"), scale_a=one, scale_b=one, out_dtype=torch.float32
        )


def test_emulation_ignores_autocast():
    a, b = operands(32, 256, 64, "rowwise", "rowwise")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_matmul(a, b)
    assert out.dtype == torch.float32
    assert_matches_float64(a, b, out)
