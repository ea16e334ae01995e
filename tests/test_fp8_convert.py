"""convert_to_fp8, use_recipe and high_precision on a tiny Qwen3 (no downloads)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fp8rl.fp8 import (
    ConversionReport,
    Fp8Linear,
    convert_to_fp8,
    fp8_linears,
    high_precision,
    named_fp8_linears,
    use_recipe,
)
from fp8rl.models import tiny_qwen3

NAMES = ("tensorwise", "rowwise", "blockwise")


def batch(seed=0, b=4, t=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (b, t), generator=g)


def lm_loss(model, ids, logits=None):
    logits = (model(ids).logits if logits is None else logits)[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.fixture(scope="module")
def reference():
    model = tiny_qwen3(seed=0)
    ids = batch()
    with torch.no_grad():
        logits = model(ids).logits
        return ids, logits, lm_loss(model, ids, logits).item()


@pytest.mark.parametrize("name", NAMES)
def test_converted_tiny_qwen3(name, reference):
    ids, ref_logits, ref_loss = reference
    model = tiny_qwen3(seed=0)
    keys = set(model.state_dict())
    report = convert_to_fp8(model, name)
    assert set(model.state_dict()) == keys  # same parameters, same names
    n_layers = 4
    assert "lm_head" in report.skipped and "lm_head" in str(report)
    # the tiny defaults are 128-aligned everywhere, so every recipe converts all 7 projections
    assert len(report.converted) == 7 * n_layers and list(report.skipped) == ["lm_head"]
    assert len(list(fp8_linears(model))) == len(report.converted)
    with torch.no_grad():
        logits = model(ids).logits
        loss = lm_loss(model, ids, logits).item()
        with high_precision(model):
            assert torch.equal(model(ids).logits, ref_logits)  # exact: same weights, F.linear
        assert all(m.recipe is not None and m.recipe.name == name for m in fp8_linears(model))
    assert abs(loss - ref_loss) / ref_loss < 0.03
    assert 0 < (logits - ref_logits).abs().max() < 0.5  # FP8 changed the numbers, a little


def test_generate_works_in_fp8():
    model = tiny_qwen3(seed=0)
    convert_to_fp8(model, "rowwise")
    prompt = batch(b=2, t=5)
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    # one quantization per layer for the whole generation: the weight cache holds
    assert {m.weight_quantizations for m in fp8_linears(model)} == {1}


def test_training_step_in_fp8_gives_close_grads():
    ids = batch(seed=1)
    ref, fp8 = tiny_qwen3(seed=0), tiny_qwen3(seed=0)
    convert_to_fp8(fp8, "blockwise")
    lm_loss(ref, ids).backward()
    lm_loss(fp8, ids).backward()
    for (n, p), q in zip(ref.named_parameters(), fp8.parameters(), strict=True):
        cos = F.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0).item()
        assert cos > 0.98, (n, cos)


def test_blockwise_converts_ragged_dims_and_skips_unaligned_layers():
    # grouped-query attention: k_proj / v_proj are 128 -> 64, a ragged half block: converted
    # (partial edge blocks); 128 -> 8 is no multiple of 16, no FP8 kernel's alignment
    gqa = tiny_qwen3(seed=0, num_key_value_heads=2)
    assert len(convert_to_fp8(gqa, "blockwise").converted) == 7 * 4
    model = tiny_qwen3(seed=0, num_key_value_heads=1, head_dim=8)
    report = convert_to_fp8(model, "blockwise")
    assert len(report.converted) == 5 * 4
    assert all(("k_proj" in k or "v_proj" in k) for k in report.skipped if k != "lm_head")
    assert "multiples of 16" in report.skipped["model.layers.0.self_attn.k_proj"]


def test_reconvert_only_updates_recipes():
    model = tiny_qwen3(seed=0, num_key_value_heads=1, head_dim=16)
    convert_to_fp8(model, "tensorwise")
    before = {n: m for n, m in named_fp8_linears(model)}
    report = convert_to_fp8(model, "mxfp8")
    assert report.converted == [] and len(report.updated) == 20
    after = dict(named_fp8_linears(model))
    assert all(after[n] is m for n, m in before.items())  # same modules, nothing copied
    kv = after["model.layers.0.self_attn.k_proj"]
    assert kv.recipe is None and "k_proj" in str(report)  # unaligned for mxfp8: high precision
    assert after["model.layers.0.mlp.up_proj"].recipe.name == "mxfp8"


def test_module_filter_and_report_text():
    model = tiny_qwen3(seed=0)
    report = convert_to_fp8(model, "rowwise", module_filter=lambda name, m: "mlp" in name)
    assert isinstance(report, ConversionReport)
    assert len(report.converted) == 12 and all("mlp" in n for n in report.converted)
    assert report.skipped["model.layers.0.self_attn.q_proj"] == "excluded by module_filter"
    text = str(report)
    assert text.startswith("FP8 conversion (rowwise): 12 converted") and "q_proj" in text


def test_shared_linear_stays_shared_and_subclasses_are_left_alone():
    class Sub(nn.Linear):
        pass

    shared = nn.Linear(32, 32)
    model = nn.ModuleDict({"a": shared, "b": shared, "c": Sub(32, 32), "d": nn.Linear(32, 48)})
    report = convert_to_fp8(model, "tensorwise")
    assert isinstance(model["a"], Fp8Linear) and model["a"] is model["b"]
    assert model["a"].weight is shared.weight
    assert "Sub" in report.skipped["c"] and type(model["c"]) is Sub
    assert isinstance(model["d"], Fp8Linear)
    with pytest.raises(ValueError, match="from_linear"):
        convert_to_fp8(nn.Linear(32, 32), "rowwise")
    with pytest.raises(ValueError, match="colwise"):
        convert_to_fp8(model, "colwise")


def test_use_recipe_sets_and_restores_even_on_exception():
    model = tiny_qwen3(seed=0)
    convert_to_fp8(model, "rowwise")
    layers = list(fp8_linears(model))
    with use_recipe(model, "tensorwise"):
        assert {m.recipe.name for m in layers} == {"tensorwise"}
        with high_precision(model):
            assert all(m.recipe is None for m in layers)
        assert {m.recipe.name for m in layers} == {"tensorwise"}
    assert {m.recipe.name for m in layers} == {"rowwise"}
    with pytest.raises(RuntimeError, match="boom"):
        with high_precision(model):
            raise RuntimeError("boom")
    assert {m.recipe.name for m in layers} == {"rowwise"}
    with pytest.raises(ValueError, match="colwise"):
        with use_recipe(model, "colwise"):
            pass
    assert {m.recipe.name for m in layers} == {"rowwise"}
