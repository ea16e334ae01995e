"""`StaticDecoder`: prefill once, then decode over persistent buffers; on CUDA each decode
step is one captured CUDA graph, replayed.

Choices (docs/rollout.md, "Static and graph decoding"):
- Sampling noise is drawn outside the graph, into the state's static buffer, before each
  step, from the caller's generator: the same stream of draws as the eager engine, from a
  generator on any device, with no graph-registered generator state.
- After a weight sync the graph is re-captured, not patched: `WeightPins` notices that an
  FP8 layer re-quantized (a new tensor) or that a parameter's storage moved. In-place
  updates of high-precision parameters need nothing: the graph reads them live.
"""

from __future__ import annotations

import contextlib

import torch

from ..fp8 import fp8_linears
from .decode import forward_step
from .kv_cache import StaticKVCache
from .masks import additive, causal_allowed, position_ids
from .params import SamplingParams
from .requantization import quantization_count
from .static_decode import DecodeState, decode_step, record


def _addresses(model) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))


def _quantized_weights(model) -> list:
    # under the rollout recipe: a stale cache re-quantizes here, outside any graph
    return [m.quantized_weight() if m.recipe is not None else None for m in fp8_linears(model)]


class WeightPins:
    """What a captured graph reads from the model by address.

    Parameters and buffers, and the quantized weights the FP8 layers cached under the
    current recipe. Holding the latter keeps their memory from being reused while the
    graph lives. Must be built and checked under the rollout's recipe, in no-grad mode.
    """

    def __init__(self, model):
        self.addresses = _addresses(model)
        self.quantized = _quantized_weights(model)

    def valid_for(self, model) -> bool:
        """False when replaying would read stale memory (re-quantizes stale layers first)."""
        now = _quantized_weights(model)
        return (
            _addresses(model) == self.addresses
            and len(now) == len(self.quantized)
            and all(a is b for a, b in zip(now, self.quantized, strict=True))
        )


class CudaGraphs:
    """Warm-up on a side stream, then `torch.cuda.CUDAGraph` capture."""

    @contextlib.contextmanager
    def warmup(self):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, step):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay  # the bound method keeps the graph (and its memory pool) alive


def default_generator(device: torch.device) -> torch.Generator:
    """The generator `exponential_(generator=None)` would use on `device`."""
    if device.type == "cuda":
        return torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()
        ]
    return torch.default_generator


class StaticDecoder:
    """Decodes `RolloutEngine` batches over buffers reused while the shapes repeat.

    `graphs`: None runs each step eagerly (the CPU path); `CudaGraphs()` captures the step
    once per (shape, sampling settings, weights) and replays it. `check_every`: steps
    between the host checks for all rows finished (each is a device sync); the steps run
    past the last EOS are dropped and the generator is rewound to where the eager engine
    leaves it. `bucket`: the cache length is rounded up to a multiple of it, so prompts
    of nearby widths share a graph. `warmup_steps`: real decode steps run eagerly before
    a capture (on a side stream on CUDA). `make_cache(max_len)`: the KV cache of the prefill
    and the decode buffers (`StaticKVCache`, or an `Fp8KVCache` bound to its scales).
    """

    def __init__(
        self,
        model,
        *,
        graphs=None,
        check_every: int = 1,
        bucket: int = 1,
        warmup_steps: int = 2,
        make_cache=StaticKVCache,
    ):
        for name, v in (
            ("check_every", check_every),
            ("bucket", bucket),
            ("warmup_steps", warmup_steps),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"StaticDecoder: {name} = {v!r} must be an int >= 1")
        self.model, self.graphs, self.make_cache = model, graphs, make_cache
        self.check_every, self.bucket, self.warmup_steps = check_every, bucket, warmup_steps
        self.allocations = 0  # new buffer sets (a new shape or sampling setting)
        self.captures = 0  # graphs captured
        self.invalidations = 0  # graphs dropped because the weights they read moved
        self._key = self._state = self._replay = self._pins = None

    def run(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        eos_ids,
        pad_id: int,
        vocab: int,
        check_finite: bool = False,
    ) -> dict:
        """The dict `RolloutEngine._sample` returns; call under no_grad and the rollout recipe.
        Buffers (kept while the shapes stay), prefill, the first token, the decode loop, the
        responses."""
        device, n, steps = prompt_ids.device, params.n, params.max_new_tokens
        rows, width = prompt_ids.shape
        dtype = self.model.get_input_embeddings().weight.dtype
        capacity = -(-(width + steps - 1) // self.bucket) * self.bucket
        state = self._buffers(rows * n, capacity, params, vocab, device, dtype, eos_ids, pad_id)
        logits = self._prefill(state, prompt_ids, prompt_mask, capacity, n, dtype)
        draw = _Draws(state, generator if generator is not None else default_generator(device))
        draw()
        record(state, logits.repeat_interleave(n, 0), params)
        t = self._decode(state, draw, params)
        return _responses(state, t, draw, check_finite)

    def _buffers(
        self, batch: int, capacity: int, params, vocab, device, dtype, eos_ids, pad_id
    ) -> DecodeState:
        """The decode buffers of these shapes: the last call's when the shapes match (a captured
        graph replays on them), else new ones; a graph whose weights moved is dropped."""
        temp = None if params.is_greedy else (params.score_temperature, params.top_p)
        steps = params.max_new_tokens
        key = (batch, capacity, steps, vocab, str(device), dtype, tuple(eos_ids), pad_id, temp)
        if key != self._key:
            self._replay = self._pins = self._state = None  # free the old graph and buffers first
            self._state = DecodeState.allocate(
                batch,
                capacity,
                steps,
                vocab,
                sampling=temp is not None,
                truncating=temp is not None and params.top_p < 1.0,
                eos_ids=eos_ids,
                pad_id=pad_id,
                dtype=dtype,
                device=device,
                make_cache=self.make_cache,
            )
            self._key = key
            self.allocations += 1
        if self._replay is not None and not self._pins.valid_for(self.model):
            self._replay = self._pins = None
            self.invalidations += 1
        return self._state

    def _prefill(self, state: DecodeState, prompt_ids, prompt_mask, capacity: int, n: int, dtype):
        """The prompts' forward into a cache copied n times into the state; the last logits."""
        width = prompt_ids.shape[1]
        prefill = self.make_cache(capacity)
        logits = forward_step(
            self.model,
            prompt_ids,
            position_ids(prompt_mask),
            additive(causal_allowed(prompt_mask, capacity), dtype),
            prefill,
            torch.arange(width, device=prompt_ids.device),
        )
        state.reset(prefill, prompt_mask, n)
        return logits

    def _decode(self, state: DecodeState, draw, params: SamplingParams) -> int:
        """Tokens 2.. eagerly, or by a captured graph once one is; returns the steps run."""
        steps, t = params.max_new_tokens, 1
        while t < steps:
            if state.eos.numel() and t % self.check_every == 0 and bool(state.finished.all()):
                break
            if self.graphs is not None and self._replay is None and steps - t > self.warmup_steps:
                t += self._capture(draw, params)
                continue
            draw()
            if self._replay is not None:
                self._replay()
            else:
                decode_step(self.model, state, params)
            t += 1
        return t

    def _capture(self, draw, params: SamplingParams) -> int:
        """Run `warmup_steps` real steps eagerly, then capture one; returns the steps run."""
        model, state = self.model, self._state
        pins = WeightPins(model)  # re-quantizes stale FP8 weights now, before any capture
        with self.graphs.warmup():
            for _ in range(self.warmup_steps):
                draw()
                decode_step(model, state, params)
        before = quantization_count(model)
        self._replay = self.graphs.capture(lambda: decode_step(model, state, params))
        if quantization_count(model) != before:
            self._replay = None
            raise RuntimeError(
                "StaticDecoder: an FP8 weight was quantized during capture; "
                "the graph would re-quantize it on every replay"
            )
        self._pins = pins
        self.captures += 1
        return self.warmup_steps


class _Draws:
    """Each decode step's sampling noise (none when greedy), with the generator's state before
    each draw kept: the draws of steps past the last live column are given back."""

    def __init__(self, state: DecodeState, gen: torch.Generator):
        self.state, self.gen, self.before = state, gen, []

    def __call__(self) -> None:
        noise = self.state.noise
        if noise is None:
            return
        self.before.append(self.gen.get_state())
        if self.gen.device == noise.device:
            noise.exponential_(generator=self.gen)
        else:
            noise.copy_(
                torch.empty(noise.shape, device=self.gen.device).exponential_(generator=self.gen)
            )

    def rewind(self, done: int) -> None:
        if len(self.before) > done:
            self.gen.set_state(self.before[done])


def _responses(state: DecodeState, t: int, draw: _Draws, check_finite: bool) -> dict:
    """The first `t` steps' columns that hold a live token, copied out of the buffers."""
    # columns are a prefix of live ones: past the last EOS every row is masked out
    done = int(state.response_mask[:, :t].any(0).sum())
    draw.rewind(done)
    out = {
        "response_ids": state.response_ids[:, :done].clone(),
        "response_mask": state.response_mask[:, :done].clone(),
        "log_probs": state.log_probs[:, :done].clone(),
        "entropy": state.entropy[:, :done].clone(),
        "truncated": ~state.finished,
    }
    if state.full_log_probs is not None:
        out["full_log_probs"] = state.full_log_probs[:, :done].clone()
    if check_finite and not bool(
        torch.isfinite(out["log_probs"]).all() & torch.isfinite(out["entropy"]).all()
    ):
        raise FloatingPointError(
            "rollout: non-finite log-probs or entropy: an inf or nan reached an FP8 "
            "quantization inside the captured decode step, which cannot check it per step"
        )
    return out
