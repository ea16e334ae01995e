"""Whole MXFP8 / MXFP4 / NVFP4 casts, bit for bit, against torchao 0.18's emulation
(`to_mx`, `NVFP4Tensor.to_nvfp4` with a per-tensor scale) and against an independent numpy +
ml_dtypes implementation (tests/mx_reference.py): normal, heavy-tailed (Student t, 2 dof),
wide-range (x 2^+-20), partly all-zero inputs, K not a multiple of the block; where torchao
departs from the format definition (tiny NVFP4 blocks), the reference decides."""

import warnings

import numpy as np
import pytest
import torch

from fp8rl.fp8 import BlockScaledTensor, quantize_mx, record_nonfinite

pytest.importorskip("ml_dtypes")
from mx_reference import mx_reference, nvfp4_reference  # noqa: E402


def _torchao():
    pytest.importorskip("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats import config, mx_tensor, nvfp4_tensor
    return config, mx_tensor, nvfp4_tensor


def inputs(k: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, k, generator=g)
    t2 = torch.distributions.StudentT(2.0).sample((48, k))
    zeros = x.clone()
    zeros[:, :64] = 0  # whole blocks of zeros
    zeros[5] = 0  # a whole row
    return {
        "normal": x,
        "student_t2": t2,
        "wide_up": t2 * 2.0**20,
        "wide_down": t2 * 2.0**-20,
        "zero_blocks": zeros,
        "all_zero": torch.zeros(4, k),
    }


def torchao_mx(x: torch.Tensor, fmt: str, rounding: str) -> torch.Tensor:
    """torchao's dequantized MX cast; K zero-padded to the block first (to_mx needs it)."""
    config, mx_tensor, _ = _torchao()
    elem = {"mxfp8": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}[fmt]
    mode = {"floor": config.ScaleCalculationMode.FLOOR, "rceil": config.ScaleCalculationMode.RCEIL}
    m, k = x.shape
    xp = torch.nn.functional.pad(x, (0, -k % 32))
    scale, data = mx_tensor.to_mx(xp, elem, 32, scaling_mode=mode[rounding])
    deq = mx_tensor.to_dtype(data, scale, elem, 32, torch.float32)
    return deq[:, :k], scale.view(torch.uint8)


def torchao_nvfp4(x: torch.Tensor):
    _, _, nv = _torchao()
    k = x.shape[1]
    xp = torch.nn.functional.pad(x, (0, -k % 16))
    amax = xp.abs().amax()
    # an all-zero tensor has g = 1 by definition; torchao's amax / 2688 = 0 would divide by 0
    g = nv.per_tensor_amax_to_scale(amax) if amax > 0 else torch.tensor(1.0)
    t = nv.NVFP4Tensor.to_nvfp4(xp, block_size=16, per_tensor_scale=g)
    return t.dequantize(torch.float32)[:, :k], t.scale.view(torch.uint8).reshape(x.shape[0], -1)


@pytest.mark.parametrize("k", [256, 200, 37])
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("rounding", ["floor", "rceil"])
def test_mx_equals_torchao_and_the_reference_bit_for_bit(fmt, rounding, k):
    for name, x in inputs(k).items():
        q = quantize_mx(x, fmt, scale_rounding=rounding)
        ref_deq, ref_scale = torchao_mx(x, fmt, rounding)
        assert torch.equal(q.dequantize(), ref_deq), name
        assert torch.equal(q.scale.view(torch.uint8), ref_scale), name
        np_deq, np_e = mx_reference(x.numpy(), fmt, rounding)
        assert np.array_equal(q.dequantize(torch.float64).numpy(), np_deq), name
        assert np.array_equal(q.scale.view(torch.uint8).numpy().astype(np.int64) - 127, np_e)


@pytest.mark.parametrize("k", [256, 200, 37])
def test_nvfp4_equals_torchao_and_the_reference_bit_for_bit(k):
    for name, x in inputs(k).items():
        q = quantize_mx(x, "nvfp4")
        ref_deq, ref_scale = torchao_nvfp4(x)
        assert torch.equal(q.dequantize(), ref_deq), name
        # torchao stores an all-zero block's scale as E4M3's smallest normal, fp8rl as 0
        # (the definition's); both dequantize to zeros
        nonzero = q.scale.float() != 0
        assert torch.equal(q.scale.view(torch.uint8)[nonzero], ref_scale[nonzero]), name
        np_deq, np_s, np_g = nvfp4_reference(x.numpy())
        assert np.array_equal(q.dequantize(torch.float64).numpy(), np_deq), name
        assert np.array_equal(q.scale.double().numpy(), np_s) and q.global_scale.item() == np_g


def test_nvfp4_tiny_blocks_follow_the_definition_where_torchao_clamps():
    """Rows scaled by 2^-20..2^20 in one tensor: blocks far below the tensor's amax get
    E4M3 block scales in its subnormal range or 0; torchao clamps them to 2^-6."""
    x = inputs()["normal"] * torch.exp2(torch.arange(-20, 28).float())[:, None]
    q = quantize_mx(x, "nvfp4")
    np_deq, np_s, _ = nvfp4_reference(x.numpy())
    assert np.array_equal(q.dequantize(torch.float64).numpy(), np_deq)
    tiny = q.scale.float() < 2.0**-6
    assert tiny.any() and (q.scale.float() == 0).any()
    ref_deq, _ = torchao_nvfp4(x)
    rows = tiny.any(dim=1)
    assert torch.equal(q.dequantize()[~rows], ref_deq[~rows])  # they agree everywhere else
    assert not torch.equal(q.dequantize()[rows], ref_deq[rows])


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_mx_near_the_bottom_of_e8m0_follows_the_definition(fmt):
    """Blocks whose scale clamps at 2^-127 (amax below 2^-119 for E4M3, 2^-125 for E2M1):
    elements are v / 2^-127, where torchao divides by float32's smallest normal, 2^-126."""
    x = inputs(64)["normal"][:4] * 2.0**-128
    q = quantize_mx(x, fmt)
    np_deq, np_e = mx_reference(x.numpy(), fmt)
    assert (np_e == -127).all()
    assert np.array_equal(q.dequantize(torch.float64).numpy(), np_deq)
    assert not torch.equal(q.dequantize(), torchao_mx(x, fmt, "floor")[0])


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_shapes_dtypes_and_leading_dims(fmt):
    x = torch.randn(3, 5, 40)
    q = quantize_mx(x, fmt)
    k = 16 if fmt == "nvfp4" else 32
    assert isinstance(q, BlockScaledTensor) and q.shape == x.shape and q.block_size == k
    assert q.scale.shape == (15, -(-40 // k)) and q.data.dtype == torch.float8_e4m3fn
    assert torch.equal(q.dequantize(), quantize_mx(x.reshape(15, 40), fmt).dequantize().view_as(x))
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16
    assert torch.equal(
        quantize_mx(x.bfloat16(), fmt).dequantize(),
        quantize_mx(x.bfloat16().float(), fmt).dequantize(),
    )


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_input_raises_or_is_recorded_and_poisons_its_block(fmt, bad):
    x = torch.randn(4, 64)
    x[1, 3] = bad
    with pytest.raises(
        FloatingPointError, match=r"layer\.q \(shape \(4, 64\)\) contains inf or nan"
    ):
        quantize_mx(x, fmt, name="layer.q")
    with record_nonfinite() as log:
        q = quantize_mx(x, fmt, name="layer.q")
    assert log == ["layer.q (shape (4, 64))"]
    deq = q.dequantize()
    assert torch.isnan(deq[1, :16]).all()  # the element's block: never a finite wrong value
    if fmt != "nvfp4":  # NVFP4's tensor scale spans every block
        assert torch.isfinite(deq[0]).all() and torch.isfinite(deq[1, 32:]).all()
    unchecked = quantize_mx(x, fmt, check_finite=False)
    assert torch.isnan(unchecked.dequantize()[1, 3])


@pytest.mark.parametrize(
    "call,err,match",
    [
        (lambda: quantize_mx(torch.randn(4, 8), "mxfp6"), ValueError, r"fmt='mxfp6'.*'nvfp4'"),
        (
            lambda: quantize_mx(torch.randn(4, 8), "mxfp8", scale_rounding="even"),
            ValueError,
            r"scale_rounding='even'.*\['floor', 'rceil'\]",
        ),
        (lambda: quantize_mx([1.0], "mxfp8"), TypeError, "must be a torch.Tensor"),
        (lambda: quantize_mx(torch.ones(4, dtype=torch.int32), "nvfp4"), ValueError, "dtype"),
        (lambda: quantize_mx(torch.ones(4).to(torch.float8_e4m3fn), "nvfp4"), ValueError, "dtype"),
        (lambda: quantize_mx(torch.tensor(1.0), "mxfp4"), ValueError, "shape"),
    ],
)
def test_bad_input_is_a_one_line_error(call, err, match):
    with pytest.raises(err, match=match):
        call()
