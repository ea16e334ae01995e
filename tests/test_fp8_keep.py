"""KeepHighPrecision (issue 43): each option keeps exactly the layers it names, the conversion
report lists every layer's choice, and the FP8 coverage is the hand-computed share of the
linear layers' in x out."""

import pytest
import torch
import torch.nn as nn

from fp8rl.fp8 import Fp8Linear, KeepHighPrecision, convert_to_fp8, fp8_linears, use_recipe
from fp8rl.fp8.keep import decoder_blocks
from fp8rl.models import tiny_qwen3

# 3 blocks; per block q 32x32 = 1024, k and v 32x16 = 512 each, o 1024, gate, up and down
# 32x64 = 2048 each: 9216 (attention 3072, MLP 6144); lm_head 32 x 48 = 1536.
# Total 3 x 9216 + 1536 = 29184 = 19 x 1536, one block 9216 = 6 x 1536.
SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    vocab_size=48,
)
ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _block(i, parts=ATTN + MLP):
    return {f"model.layers.{i}.{p}" for p in parts}


CASES = {  # option -> (the layers kept, the FP8 coverage)
    "default": ({}, {"lm_head"}, 18 / 19),
    "lm_head quantized": ({"lm_head": False}, set(), 1.0),
    "first and last block": (
        {"first_blocks": 1, "last_blocks": 1},
        {"lm_head"} | _block(0) | _block(2),
        6 / 19,
    ),
    "down_proj": (
        {"down_proj": True},
        {"lm_head"} | {f"model.layers.{i}.mlp.down_proj" for i in range(3)},
        14 / 19,
    ),
    "attention by pattern": (
        {"modules": ("*.self_attn.*",), "lm_head": False},
        _block(0, ATTN) | _block(1, ATTN) | _block(2, ATTN),
        13 / 19,  # 3 x 3072 = 9216 = 6 x 1536 of 19 x 1536 kept
    ),
    "everything": ({"first_blocks": 3}, {"lm_head"} | _block(0) | _block(1) | _block(2), 0.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_option_keeps_exactly_its_layers_and_the_coverage_is_hand_computed(case):
    options, kept, coverage = CASES[case]
    model = tiny_qwen3(seed=0, **SHAPE)
    report = convert_to_fp8(model, "rowwise", keep=KeepHighPrecision(**options))
    assert set(report.skipped) == kept
    assert len(report.converted) + len(kept) == 3 * 7 + 1
    assert report.coverage == pytest.approx(coverage, rel=1e-12, abs=1e-15)
    # a kept layer stays an nn.Linear, so no phase's recipe reaches it: rollout and training agree
    with use_recipe(model, "blockwise"):
        names = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
        assert names == set(report.converted) and all(m.recipe for m in fp8_linears(model))
    for name, module in model.named_modules():
        if name in kept:
            assert type(module) is nn.Linear, name


def test_the_report_lists_every_layer_with_its_choice_and_why():
    model = tiny_qwen3(seed=0, **SHAPE)
    keep = KeepHighPrecision(first_blocks=1, down_proj=True, modules=("*.2.self_attn.o_proj",))
    text = str(convert_to_fp8(model, "rowwise", keep=keep))
    lines = text.splitlines()
    # kept 9216 + 2 x 2048 + 1024 + 1536 = 15872 of 29184: 13312 / 29184 = 45.61 % in FP8
    assert "FP8 coverage: 45.61 %" in lines[1], text
    assert "  kept       lm_head (32 -> 48): lm_head stays high precision" in text
    assert (
        "  kept       model.layers.0.mlp.down_proj (64 -> 32): block 0 of 3 "
        "(keep_high_precision.first_blocks=1); an MLP down-projection" in text
    )
    assert "  kept       model.layers.2.self_attn.o_proj (32 -> 32): matches" in text
    assert "  converted  model.layers.1.self_attn.k_proj (32 -> 16)" in text
    listed = [ln.split()[1] for ln in lines if ln.startswith(("  converted ", "  kept "))]
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert sorted(listed) == sorted(linears) and len(linears) == 22


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"first_blocks": 4}, ("first_blocks", 4, "at most the model's 3 decoder blocks")),
        ({"last_blocks": 9}, ("last_blocks", 9, "at most the model's 3 decoder blocks")),
        ({"modules": ("*.qkv_proj",)}, ("modules", "*.qkv_proj", "a pattern matching")),
    ],
)
def test_options_the_model_cannot_honour_are_named(options, problem):
    problems = KeepHighPrecision(**options).problems(tiny_qwen3(seed=0, **SHAPE))
    assert len(problems) == 1
    (field, value, allowed) = problems[0]
    assert (field, value) == problem[:2] and allowed.startswith(problem[2]), problems
    assert KeepHighPrecision(first_blocks=3, last_blocks=3).problems(tiny_qwen3(**SHAPE)) == []


def test_a_model_without_blocks_or_down_proj_says_so():
    model = nn.ModuleDict({"up": nn.Linear(16, 32), "lm_head": nn.Linear(32, 16)})
    problems = KeepHighPrecision(first_blocks=1, down_proj=True).problems(model)
    assert [p[0] for p in problems] == ["first_blocks", "down_proj"], problems


def test_the_decoder_blocks_are_the_outermost_list_of_linears():
    # a MoE block holds a deeper list (its experts); a list of norms holds no linear layer
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))

    model = nn.Module()
    model.norms = nn.ModuleList(nn.LayerNorm(16) for _ in range(5))
    model.body = nn.Module()
    model.body.layers = nn.ModuleList(Block() for _ in range(2))
    assert decoder_blocks(model) == ("body.layers", 2)
    keep = KeepHighPrecision(last_blocks=1, lm_head=False)
    assert set(keep.reasons(model)) == {f"body.layers.1.experts.{i}" for i in range(8)}
    assert decoder_blocks(nn.Linear(2, 2)) is None


def test_the_default_is_fp8rl_s_old_behaviour():
    model = tiny_qwen3(seed=0, **SHAPE)
    report = convert_to_fp8(model, "rowwise")
    assert report.keep == KeepHighPrecision() and set(report.skipped) == {"lm_head"}
    assert torch.is_tensor(model.lm_head.weight) and type(model.lm_head) is nn.Linear


def test_fused_experts_are_kept_by_block_and_counted_per_expert_in_the_coverage():
    """A Qwen3-MoE's experts are one module of 3-D weights: first_blocks keeps block 0's whole,
    and the coverage weighs each fused projection by its expert count (hand-computed here)."""
    from fp8rl.models.tiny import tiny_model

    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    cfg = model.config
    report = convert_to_fp8(model, "rowwise", keep=KeepHighPrecision(first_blocks=1))
    kept0 = [n for n in report.skipped if n.startswith("model.layers.0.")]
    assert "model.layers.0.mlp.experts.gate_up_proj" in kept0
    assert "model.layers.0.mlp.experts.down_proj" in kept0
    assert "model.layers.1.mlp.experts.down_proj" in report.converted
    h, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    attn = h * q + 2 * h * kv + q * h
    experts = e * (h * 2 * i + i * h)  # the router, an (E, H) module of its own, is no nn.Linear
    block = attn + experts
    lm_head = h * cfg.vocab_size
    assert report.coverage == pytest.approx(block / (2 * block + lm_head))
