"""Mismatch gates: for every rollout x training precision pair, the k3 KL and the token
probability error between fp8rl's rollout engine and the trainer's forward stay under bounds
derived from the formats (docs/rollout.md, "Mismatch gates"), and planted bugs trip them.

Each side quantizes on its own (the weight caches are dropped between them), as two engines
would. The planted bugs are monkeypatches of the weight quantizer on the rollout side only.
"""

import copy
import math

import pytest
import torch

import fp8rl.fp8.linear as fp8_linear
import fp8rl.rollout.fp8_kv_cache as fp8_kv
from _mismatch_bounds import EPS32, bounds, format_noise, logit_scale
from fp8rl.config.precision import HIGH_PRECISIONS, PRECISIONS, prepare_model, recipe_for
from fp8rl.fp8 import fp8_linears, high_precision, use_recipe
from fp8rl.fp8.formats import saturating_cast
from fp8rl.fp8.tensor import Fp8Tensor
from fp8rl.models.tiny import tiny_qwen3
from fp8rl.rl import k3_kl, token_prob_error
from fp8rl.rollout import RolloutEngine, SamplingParams, compute_log_probs

QUANTIZED = tuple(p for p in PRECISIONS if p not in HIGH_PRECISIONS)
GATED = ("bf16", *QUANTIZED)  # fp32 is the same path as bf16: the master dtype, no recipe
# activation scales that see the whole batch (a tensor amax): the rollout's decode step and the
# trainer's forward quantize the same activation on different grids
BATCH_SCALED = ("fp8-tensorwise", "nvfp4")
PARAMS = SamplingParams(n=4, max_new_tokens=16)


# ------------------------------------------------------------------ the derivation


def pair_variance(rollout: str, train: str, widest: int) -> float:
    """e: the relative error variance one quantized linear's output carries between the sides.

    Independent quantizations add their variances (weights and inputs, both sides). The same
    recipe quantizes bitwise-identical weights, and inputs that differ by float32 rounding
    only, unless its activation scale sees the batch. There the sides disagree only where the
    float32 difference (at most EPS32 * K relative in a K-term dot product) crosses a rounding
    boundary: with probability EPS32 * K / (2u), by one grid step 2u, u = sqrt(3) * eta the
    uniform-equivalent half step, so e = 2u * EPS32 * K."""
    if rollout != train:
        return sum(format_noise(p, w) ** 2 for p in (rollout, train) for w in (True, False))
    if rollout in BATCH_SCALED:
        return 2 * format_noise(rollout, False) ** 2
    u = math.sqrt(3) * format_noise(rollout, False)
    return 2 * u * EPS32 * widest + (EPS32 * widest) ** 2  # the last term: float32 itself


def kv_noise() -> float:
    """eta_kv: relative RMS error of the FP8 KV cache's round trip (e4m3, a per-head scale of
    amax * MARGIN / 448) on i.i.d. N(0, 1) data: the e4m3 element noise, as for the linears."""
    x = torch.randn(1, 4, 256, 128, generator=torch.Generator().manual_seed(0))
    scale = x.abs().amax(dim=(0, 2, 3)) * fp8_kv.MARGIN / 448
    back = fp8_kv.dequantize_kv(fp8_kv.quantize_kv(x, scale), scale, torch.float32)
    return float((back - x).norm() / x.norm())


def gate_bounds(
    rollout: str, train: str, depth: int, widest: int, logit_scale: float, kv_layers: int = 0
):
    """(KL bound, token-probability-error bound). `depth` quantized linears each add e to the
    relative error variance of the logits (an upper bound: through the residual stream and
    the norms a layer's error reaches the logits with a gain of at most 1), which moves the
    log-prob of a token by delta = dz_y - E_p[dz], Var(delta) <= 2 e depth s^2 for logits of
    RMS s; k3 KL ~ E[delta^2] / 2 and exp|delta| - 1 ~ |delta| <= sqrt(E[delta^2]).
    An FP8 KV cache on the rollout side (`kv_layers` layers) adds the keys' and the values'
    round trip, eta_kv^2 each, the same way (the trainer's forward caches nothing)."""
    e_sum = pair_variance(rollout, train, widest) * depth + 2 * kv_layers * kv_noise() ** 2
    return bounds(e_sum, logit_scale)


# ------------------------------------------------------------------ the fixed model and batch


@pytest.fixture(scope="module")
def base():
    return tiny_qwen3(seed=0)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(4, 12, (8,), generator=g).tolist()
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in lengths]


def measure(base, prompts, rollout: str, train: str, *, before_rollout=None, kv_cache="model"):
    """(KL, token probability error, KL bound, error bound) of the pair on the fixed batch."""
    model = copy.deepcopy(base)
    prepare_model(model, rollout, train)
    engine = RolloutEngine(model, recipe=recipe_for(rollout), eos_token_id=[], kv_cache=kv_cache)
    if before_rollout is not None:
        before_rollout(model, engine, prompts)
    _SIDE["rollout"] = True
    try:
        batch = engine.generate(prompts, PARAMS, generator=torch.Generator().manual_seed(2))
    finally:
        _SIDE["rollout"] = False
    for layer in fp8_linears(model):  # the trainer quantizes on its own
        layer.invalidate_weight_cache()
    with torch.no_grad(), use_recipe(model, recipe_for(train)):
        lp, _ = compute_log_probs(model, batch, temperature=batch.temperature)
    rollout_lp, mask = batch.comparable_log_probs, batch.response_mask
    kl = float(k3_kl(rollout_lp, lp, mask))
    tpe = float(token_prob_error(rollout_lp, lp, mask))
    # every projection of the tiny Qwen3 converts under every recipe (its dims are multiples
    # of 128); lm_head stays high precision and adds float32 rounding only
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    linears = [m for m in linears if m is not model.get_output_embeddings()]
    depth, widest = len(linears), max(m.in_features for m in linears)
    kv_layers = model.config.num_hidden_layers if kv_cache == "fp8" else 0
    kl_max, tpe_max = gate_bounds(
        rollout, train, depth, widest, logit_scale(model, batch), kv_layers
    )
    return kl, tpe, kl_max, tpe_max


# ------------------------------------------------------------------ the planted bugs

_SIDE = {"rollout": False, "bug": None}
_real_quantize_operand = fp8_linear.quantize_operand


def _buggy_quantize_operand(x2, recipe, *, fmt, weight, name):
    bug = _SIDE["bug"]
    if not (weight and _SIDE["rollout"] and bug is not None):
        return _real_quantize_operand(x2, recipe, fmt=fmt, weight=weight, name=name)
    return bug(x2, recipe, fmt=fmt, name=name)


def bf16_copy(x2, recipe, *, fmt, name):
    """The rollout quantizes a BF16-rounded copy of the float32 master (xtuner's bug)."""
    return _real_quantize_operand(
        x2.bfloat16().to(x2.dtype), recipe, fmt=fmt, weight=True, name=name
    )


class StaleScales:
    """The rollout keeps the scales of its first quantization after the weights change: a
    weight sync that re-rounds the pushed values but skips the scale refresh."""

    def __init__(self):
        self.first: dict[str, Fp8Tensor] = {}

    def __call__(self, x2, recipe, *, fmt, name):
        fresh = _real_quantize_operand(x2, recipe, fmt=fmt, weight=True, name=name)
        old = self.first.setdefault(name, fresh)
        if old is fresh or not isinstance(old, Fp8Tensor):
            return fresh
        data = saturating_cast(x2 / old.full_scale(), fmt)
        return Fp8Tensor(data, old.scale, old.granularity, old.block, old.fmt).with_dequantized()


def push_update(model, engine, prompts):
    """Quantize once for the rollout, then one AdamW step (lr 1e-4) changes every weight: the
    next rollout must re-quantize them, scales included."""
    _SIDE["rollout"] = True
    try:
        engine.sync_weights(force=True)
    finally:
        _SIDE["rollout"] = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = engine.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=4))
    with high_precision(model):
        lp, _ = compute_log_probs(model, batch)
    (-lp.sum()).backward()
    opt.step()


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setattr(fp8_linear, "quantize_operand", _buggy_quantize_operand)
    yield _SIDE
    _SIDE["bug"] = None


# ------------------------------------------------------------------ the gates


@pytest.mark.parametrize("train", GATED)
@pytest.mark.parametrize("rollout", GATED)
def test_mismatch_stays_under_the_format_bound(base, prompts, rollout, train):
    kl, tpe, kl_max, tpe_max = measure(base, prompts, rollout, train)
    assert kl <= kl_max, (rollout, train, kl, kl_max)
    assert tpe <= tpe_max, (rollout, train, tpe, tpe_max)


@pytest.mark.parametrize("precision", ["fp8-rowwise", "fp8-blockwise", "mxfp8"])
def test_a_differently_rounded_weight_copy_trips_the_gate(base, prompts, planted, precision):
    planted["bug"] = bf16_copy
    kl, tpe, kl_max, tpe_max = measure(base, prompts, precision, precision)
    assert kl > kl_max and tpe > tpe_max, (precision, kl, kl_max, tpe, tpe_max)


@pytest.mark.parametrize("precision", ["fp8-rowwise", "fp8-blockwise"])
def test_a_stale_scale_after_a_weight_push_trips_the_gate(base, prompts, planted, precision):
    planted["bug"] = StaleScales()
    kl, tpe, kl_max, tpe_max = measure(
        base, prompts, precision, precision, before_rollout=push_update
    )
    assert kl > kl_max and tpe > tpe_max, (precision, kl, kl_max, tpe, tpe_max)


def test_the_weight_push_alone_passes(base, prompts):
    """The control of the stale-scale bug: the same push with the scales refreshed."""
    kl, tpe, kl_max, tpe_max = measure(
        base, prompts, "fp8-rowwise", "fp8-rowwise", before_rollout=push_update
    )
    assert kl <= kl_max and tpe <= tpe_max, (kl, kl_max, tpe, tpe_max)


# ------------------------------------------------------------------ the FP8 KV cache

KV_PAIRS = [("bf16", "bf16"), ("fp8-rowwise", "fp8-rowwise"), ("fp8-rowwise", "bf16")]


@pytest.mark.parametrize("rollout, train", KV_PAIRS)
def test_an_fp8_kv_cache_stays_under_its_bound_and_adds_mismatch(base, prompts, rollout, train):
    kl, tpe, kl_max, tpe_max = measure(base, prompts, rollout, train, kv_cache="fp8")
    assert kl <= kl_max and tpe <= tpe_max, (rollout, train, kl, kl_max, tpe, tpe_max)
    kl_plain, tpe_plain, _, _ = measure(base, prompts, rollout, train)
    assert kl > kl_plain and tpe > tpe_plain, (rollout, train, kl, kl_plain)


def push_larger_values(factor: float):
    """Calibrate the KV scales, then a weight push that makes every value `factor`x larger
    (v_proj scaled in place: its version counter moves, as after an optimizer step)."""

    def push(model, engine, prompts):
        ids = torch.tensor([[0] * (12 - len(p)) + p for p in prompts])
        engine.calibrate_kv(
            ids, ids.new_tensor([[0] * (12 - len(p)) + [1] * len(p) for p in prompts])
        )
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.v_proj.weight.mul_(factor)

    return push


KV_PUSH = 4000.0  # values of amax ~3000 after the push: past e4m3's 448 at a scale of 1


def measure_after_kv_push(base, prompts, precision: str):
    """measure() of the same-precision pair with the FP8 KV cache, after the value push."""
    return measure(
        base,
        prompts,
        precision,
        precision,
        kv_cache="fp8",
        before_rollout=push_larger_values(KV_PUSH),
    )


@pytest.mark.parametrize("precision", ["bf16", "fp8-rowwise"])
def test_the_kv_push_with_fresh_scales_passes(base, prompts, precision):
    kl, tpe, kl_max, tpe_max = measure_after_kv_push(base, prompts, precision)
    assert kl <= kl_max and tpe <= tpe_max, (precision, kl, kl_max, tpe, tpe_max)


@pytest.mark.parametrize("precision", ["bf16", "fp8-rowwise"])
def test_a_stale_kv_scale_after_a_push_trips_the_gate(base, prompts, monkeypatch, precision):
    # the bug: the engine never notices the push (a weight sync that skips the recalibration)
    monkeypatch.setattr(RolloutEngine, "_weights_key", lambda self: "never changes")
    kl, tpe, kl_max, tpe_max = measure_after_kv_push(base, prompts, precision)
    assert kl > kl_max and tpe > tpe_max, (precision, kl, kl_max, tpe, tpe_max)


@pytest.mark.parametrize("precision", ["bf16", "fp8-rowwise"])
def test_a_kv_scale_forced_to_one_trips_the_gate(base, prompts, monkeypatch, precision):
    # NeMo-RL's bug: calibrated scales replaced by 1.0 on the way to the engine
    monkeypatch.setattr(fp8_kv, "scale_from_amax", lambda amax, fmt, pow2: torch.ones_like(amax))
    kl, tpe, kl_max, tpe_max = measure_after_kv_push(base, prompts, precision)
    assert kl > kl_max and tpe > tpe_max, (precision, kl, kl_max, tpe, tpe_max)
