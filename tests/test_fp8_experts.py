"""Fp8Experts (fused MoE experts under a recipe) against a float64 reference of the same expert
computation, against one Fp8Linear per expert, and against transformers' own experts."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fp8rl.fp8 import Fp8Linear, convert_to_fp8, fp8_linears, high_precision
from fp8rl.fp8.experts import Fp8Experts

pytestmark = pytest.mark.families

E, H, INTER, N, K = 4, 32, 48, 20, 2


def experts_module(seed=0):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=INTER, num_experts=E)
    mod = Qwen3MoeExperts(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        mod.gate_up_proj.copy_(torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5)
        mod.down_proj.copy_(torch.randn(E, H, INTER, generator=g) * INTER**-0.5)
    return mod


def routing(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g)
    index = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)])
    weights = torch.softmax(torch.randn(N, K, generator=g), -1)
    return x, index, weights


def q_rowwise(a: torch.Tensor) -> torch.Tensor:
    """e4m3 with one scale (amax / 448) per row, back in float64: the rowwise recipe."""
    a = a.float()
    s = a.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
    return (a / s).to(torch.float8_e4m3fn).double() * s.double()


def reference(mod, x, index, weights) -> torch.Tensor:
    """Each token's sum over its experts of weight * down(silu(gate) * up), every GEMM on
    rowwise-quantized operands, accumulated in float64."""
    out = torch.zeros(N, H, dtype=torch.float64)
    for t in range(N):
        for j in range(K):
            e = int(index[t, j])
            xt = x[t : t + 1]
            gu = (q_rowwise(xt) @ q_rowwise(mod.gate_up_proj[e].detach()).T).float()
            gate, up = gu.chunk(2, -1)
            h = F.silu(gate) * up
            y = q_rowwise(h) @ q_rowwise(mod.down_proj[e].detach()).T
            out[t] += float(weights[t, j]) * y[0]
    return out


def test_forward_equals_float64_reference_of_the_expert_computation():
    mod = experts_module()
    x, index, weights = routing()
    got = Fp8Experts(mod, "rowwise")(x, index, weights)
    want = reference(mod, x, index, weights)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    # and it is FP8: clearly off the high-precision output
    exact = mod(x, index, weights)
    assert (got - exact).norm() / exact.norm() > 5e-3


def test_high_precision_is_transformers_experts_exactly():
    mod = experts_module()
    x, index, weights = routing()
    assert torch.equal(Fp8Experts(mod, None)(x, index, weights), mod(x, index, weights))


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "mxfp4"])
def test_forward_and_grads_equal_one_fp8_linear_per_expert(name):
    """Each expert's GEMMs (forward, grad input, grad weight) are an Fp8Linear's."""
    mod = experts_module()
    x, index, weights = routing()
    fp8 = Fp8Experts(copy.deepcopy(mod), name)
    gate_up = [Fp8Linear.from_linear(_linear(w), name) for w in mod.gate_up_proj]
    down = [Fp8Linear.from_linear(_linear(w), name) for w in mod.down_proj]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    gy = torch.randn(N, H, generator=torch.Generator().manual_seed(5))
    y = fp8(xa, index, weights)
    y.backward(gy)
    want = torch.zeros(N, H)
    for e in range(E):
        tok, pos = torch.where(index == e)
        gate, up = gate_up[e](xb[tok]).chunk(2, -1)
        want = want.index_add(0, tok, down[e](F.silu(gate) * up) * weights[tok, pos, None])
    want.backward(gy)
    assert torch.allclose(y, want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)
    for e in range(E):
        assert torch.allclose(fp8.gate_up_proj.grad[e], gate_up[e].weight.grad, atol=1e-6)
        assert torch.allclose(fp8.down_proj.grad[e], down[e].weight.grad, atol=1e-6)


def _linear(w: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def test_conversion_reports_expert_projections_and_keeps_the_router():
    from fp8rl.models.tiny import tiny_model

    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    report = convert_to_fp8(model, "rowwise")
    experts = [n for n in report.converted if ".mlp.experts." in n]
    assert experts == [
        f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")
    ]
    assert set(report.experts.values()) == {4}
    assert "x 4 experts" in str(report)
    assert report.skipped["model.layers.0.mlp.gate"] == "a MoE router stays high precision"
    assert sum(isinstance(m, Fp8Experts) for m in fp8_linears(model)) == 2
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad(), high_precision(model):
        hp = model(input_ids=ids).logits
    with torch.no_grad():
        q = model(input_ids=ids).logits
    assert 1e-4 < (q - hp).abs().max() < 0.5 * hp.abs().max()


def test_misaligned_experts_are_reported_skipped():
    from fp8rl.models.tiny import tiny_model

    model = tiny_model("qwen3_moe", num_hidden_layers=1, moe_intermediate_size=40)
    report = convert_to_fp8(model, "rowwise")
    why = report.skipped["model.layers.0.mlp.experts.down_proj"]
    assert "intermediate=40" in why and "16" in why
    assert not any(isinstance(m, Fp8Experts) for m in model.modules())
