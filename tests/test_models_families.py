"""Every supported family (models.FAMILIES), tiny and random from transformers' own config class,
through every stage: FP8 conversion (the report checked against the model's own layers), the
rollout engine (eager and static decoders, FP8 KV cache), log-probs against transformers' own
forward, and the trainer (FP8 rowwise, Calibrated Clipping's shadow passes every step) with a
checkpoint and an exact resume. Also run on the vLLM venv's pinned transformers
(scripts/check-vllm.sh)."""

import copy

import pytest
import torch
import torch.nn as nn

from fp8rl.config import config_from_dict
from fp8rl.fp8 import convert_to_fp8, high_precision
from fp8rl.fp8.experts import Fp8Experts, is_fused_experts
from fp8rl.models import FAMILIES, tiny_model
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.rollout.logprobs import compute_log_probs
from fp8rl.train.runlog import read_metrics
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_runs import strip_times
from helpers_step import parity_reward

pytestmark = pytest.mark.families

VOCAB = 40
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def shape(family: str) -> dict:
    extra = {"moe_intermediate_size": 32} if family == "qwen3_moe" else {}
    return {**SHAPE, **extra}


def projections(model: nn.Module) -> list[str]:
    """The GEMM weights a recipe must convert, read off the unconverted model: every
    nn.Linear but lm_head, and each fused-experts module's two 3-D weights."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name != "lm_head":
            out.append(name)
        elif is_fused_experts(mod):
            out += [f"{name}.gate_up_proj", f"{name}.down_proj"]
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(family, model converted to FP8 rowwise, its unconverted copy, conversion report)."""
    model = tiny_model(request.param, vocab_size=VOCAB, seed=1, **shape(request.param))
    original = copy.deepcopy(model)
    report = convert_to_fp8(model, "rowwise")
    return request.param, model, original, report


def test_the_report_lists_every_projection_converted(family):
    name, model, original, report = family
    want = projections(original)
    # per layer: q, k, v, o and gate, up, down; Phi-3 fuses qkv and gate_up; Qwen3-MoE's
    # experts fuse gate_up (and the down) of all its experts
    assert len(want) == 2 * {"phi3": 4, "qwen3_moe": 6}.get(name, 7)
    assert sorted(report.converted) == sorted(want)
    assert not report.updated
    kept = {k for k in report.skipped if k != "lm_head"}
    assert all(k.endswith(".mlp.gate") for k in kept), report.skipped  # MoE routers only
    if name == "qwen3_moe":
        assert len(kept) == 2 and sum(isinstance(m, Fp8Experts) for m in model.modules()) == 2
    if name == "phi3":  # fused projections are plain nn.Linear: converted as such
        assert {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"} <= set(
            report.converted
        )


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]  # left padding in every batch


def test_rollout_eager_and_static_decoders_with_fp8_kv_cache_agree(family):
    name, model, _, _ = family
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    batches = []
    for decode in ("eager", "static"):
        engine = RolloutEngine(
            model, recipe="rowwise", decode=decode, kv_cache="fp8", eos_token_id=[]
        )
        batches.append(engine.generate(PROMPTS, params, generator=torch.Generator().manual_seed(0)))
        assert engine.kv_scales.calibrations == 1
    a, b = batches
    moe = name == "qwen3_moe"
    assert engine._routed is moe  # auto never captures a MoE model's routing-dependent loop
    assert a.response_ids.shape == (6, 5) and bool(a.response_mask.all())
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=1e-5, atol=1e-5)
    assert bool((a.log_probs < 0).all())


def test_log_probs_equal_transformers_forward_with_a_2d_mask(family):
    """fp32, high precision: left-padded prompts, right-padded responses."""
    _, model, original, _ = family
    g = torch.Generator().manual_seed(3)
    b, p, t = 3, 6, 5
    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    prompt_mask[0, :3] = prompt_mask[2, :1] = False
    response_mask = torch.ones(b, t, dtype=torch.bool)
    response_mask[1, 3:] = response_mask[2, 4:] = False
    batch = {
        "prompt_ids": torch.randint(1, VOCAB, (b, p), generator=g) * prompt_mask,
        "prompt_mask": prompt_mask,
        "response_ids": torch.randint(1, VOCAB, (b, t), generator=g) * response_mask,
        "response_mask": response_mask,
    }
    with torch.no_grad(), high_precision(model):
        got, _ = compute_log_probs(model, batch)
    ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], 1)
    mask = torch.cat([prompt_mask, response_mask], 1).long()
    with torch.no_grad():
        logits = original(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0)
        ).logits.double()
    lp = logits[:, p - 1 : -1].log_softmax(-1)
    want = lp.gather(-1, batch["response_ids"][..., None])[..., 0] * response_mask
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    assert got[response_mask].abs().min() > 0.1  # real log-probs, not padding zeros


def run_config(out, family: str, steps: int = 2) -> dict:
    return tiny_config(
        out,
        model={"tiny": {"model_type": family, **shape(family)}},
        rollout={"kv_cache": "fp8", "prompts_per_step": 2, "n": 4, "max_new_tokens": 3},
        train={"steps": steps, "mini_batches": 1},
        loss={"mode": "calibrated"},
        calibration={"interval": 1, "shadow_every": 1, "min_tokens": 2},
        log={"checkpoint_every": 1, "eval_size": 0},
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_trainer_shadow_passes_checkpoint_and_exact_resume(tmp_path, name):
    full = parity_reward(Trainer(config_from_dict(run_config(tmp_path / "full", name))))
    assert full.model.config.model_type == name
    assert (
        not full.conversion.skipped.keys()
        - {"lm_head"}
        - {k for k in full.conversion.skipped if k.endswith(".mlp.gate")}
    )
    rows = full.fit()
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert 0 < r["shadow/nmae_prob"] < 1, r  # the FP8 run against its high-precision twin
    assert rows[1]["actor/grad_norm"] > 0 and rows[1]["calib/updated"] == 1.0
    part_cfg = config_from_dict(run_config(tmp_path / "part", name))
    parity_reward(Trainer(part_cfg)).run(1)
    cont = parity_reward(Trainer(part_cfg))
    cont.fit(resume=True)
    assert cont.step == 2
    assert strip_times(read_metrics(tmp_path / "part")) == strip_times(rows)
    for k, v in cont.model.state_dict().items():
        torch.testing.assert_close(v, full.model.state_dict()[k], rtol=0, atol=0, msg=k)
