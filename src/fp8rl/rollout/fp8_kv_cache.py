"""An FP8 (e4m3) KV cache with per-head scales, and the calibration pass that sets them.

Keys and values are quantized on write (`x / scale`, saturating cast to e4m3, stored as the
e4m3 bytes) and dequantized on read (`e4m3 value * scale`), so attention sees exactly what
an FP8 cache holds. Scales are per layer and KV head, `amax * MARGIN / 448`, from a forward
of the current weights over a calibration batch (docs/rollout.md, "FP8 KV cache").
"""

from __future__ import annotations

import torch

from ..fp8 import saturating_cast, scale_from_amax
from ..fp8.formats import fp8_to_float32
from .decode import forward_step
from .kv_cache import StaticKVCache
from .masks import additive, causal_allowed, position_ids

KV_CACHE_DTYPES = ("model", "fp8")
KV_FORMAT = "e4m3"
# headroom over the calibration batch's amax: the decode's keys and values (the responses) may
# exceed the prompts'; e4m3's relative precision is the same over its normal range (2^-6 to 448
# of the scale), so a 2x margin only moves values below amax / 14336 into subnormals
MARGIN = 2.0


class KVScales:
    """Per-layer dequantization scales (H_kv,) of keys and values, float32.

    `set` writes in place once a layer's scales exist: a captured decode step reads them by
    address, so a recalibration reaches its replays.
    """

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.calibrations = 0  # how many times `set_from_amax` ran (tests: no stale scales)

    def set_from_amax(self, amax: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k_amax, v_amax) in amax.items():
            for store, a in ((self.keys, k_amax), (self.values, v_amax)):
                s = scale_from_amax(a * MARGIN, KV_FORMAT, False)
                if layer in store and store[layer].shape == s.shape:
                    store[layer].copy_(s)
                else:
                    store[layer] = s
        self.calibrations += 1

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.keys:
            raise RuntimeError(
                f"Fp8KVCache: no scales for layer {layer_idx}: calibrate the KV scales "
                "(RolloutEngine.calibrate_kv) before the forward"
            )
        return self.keys[layer_idx], self.values[layer_idx]


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The e4m3 bytes (uint8) of x (B, H, Q, D) at per-head dequantization scales (H,)."""
    q = saturating_cast(x.float() / scale.view(1, -1, 1, 1), KV_FORMAT)
    return q.view(torch.uint8)


def dequantize_kv(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values the e4m3 bytes (B, H, S, D) stand for, in `dtype`."""
    x = fp8_to_float32(data.view(torch.float8_e4m3fn)) * scale.view(1, -1, 1, 1)
    return x.to(dtype)


class Fp8KVCache(StaticKVCache):
    """`StaticKVCache` whose buffers hold e4m3 bytes: quantize on write, dequantize on read.

    The buffers are uint8 (the e4m3 bit patterns), so copies, row repeats and slot writes
    are plain byte moves on every device; zeros are e4m3 +0.
    """

    def __init__(self, max_len: int, scales: KVScales):
        super().__init__(max_len)
        self.scales = scales

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ):
        if self.slots is None:
            raise RuntimeError("Fp8KVCache.update: set cache.slots before the forward")
        k_scale, v_scale = self.scales.layer(layer_idx)
        if layer_idx not in self.keys:
            b, h, _, d = key_states.shape
            new = dict(dtype=torch.uint8, device=key_states.device)
            self.keys[layer_idx] = torch.zeros(b, h, self.max_len, d, **new)
            self.values[layer_idx] = torch.zeros(b, h, self.max_len, value_states.shape[-1], **new)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.slots, quantize_kv(key_states, k_scale))
        values.index_copy_(2, self.slots, quantize_kv(value_states, v_scale))
        return (
            dequantize_kv(keys, k_scale, key_states.dtype),
            dequantize_kv(values, v_scale, value_states.dtype),
        )


class _AmaxRecorder(StaticKVCache):
    """A cache that keeps nothing: it records each layer's per-head amax of the keys and
    values of the valid (non-pad) positions and hands the forward its own keys and values."""

    def __init__(self, valid: torch.Tensor):
        super().__init__(valid.shape[1])
        self.valid = valid[:, None, :, None]  # (B, 1, S, 1)
        self.amax: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        def head_amax(x):
            return x.float().abs().masked_fill(~self.valid, 0.0).amax(dim=(0, 2, 3))

        self.amax[layer_idx] = (head_amax(key_states), head_amax(value_states))
        return key_states, value_states


def kv_amax(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """{layer: (key amax (H_kv,), value amax (H_kv,))} of one forward of the model over the
    left-padded batch (B, S); call under no_grad and the recipe the rollout runs."""
    valid = attention_mask.bool()
    recorder = _AmaxRecorder(valid)
    dtype = model.get_input_embeddings().weight.dtype
    forward_step(
        model,
        input_ids,
        position_ids(valid),
        additive(causal_allowed(valid, valid.shape[1]), dtype),
        recorder,
        torch.arange(valid.shape[1], device=input_ids.device),
    )
    return recorder.amax
