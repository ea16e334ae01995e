"""`RolloutEngine`: batched sampling with a KV cache, in high precision or FP8 (W8A8)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..fp8 import as_recipe, fp8_linears
from ..fp8.experts import is_fused_experts
from .batch import RolloutBatch
from .decode import forward_step
from .fp8_kv_cache import KV_CACHE_DTYPES, Fp8KVCache, KVScales, kv_amax
from .graph_decode import CudaGraphs, StaticDecoder
from .kv_cache import StaticKVCache
from .masks import additive, causal_allowed, check_model_supported, check_window, position_ids
from .params import SamplingParams
from .prompts import decode_responses, encode_prompts, left_pad
from .requantization import requantize, use_recipe
from .sampling import sample_next


def _token_ids(value, name: str, vocab_size: int) -> tuple[int, ...]:
    ids = (value,) if isinstance(value, int) else tuple(value)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(
                f"RolloutEngine: {name} = {value!r} must be token id(s) in [0, {vocab_size})"
            )
    return ids


DECODE_MODES = ("auto", "eager", "static", "graph")


def _first_set(*candidates):
    for c in candidates:
        if c is not None:
            return c
    return None


def _id_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def special_token_ids(model, tokenizer, vocab_size: int, eos_token_id=None, pad_token_id=None):
    """(EOS ids, pad id) as every engine resolves them. EOS: the argument when given, else
    every end-of-turn id the model declares, in this order without repeats: the tokenizer's,
    the generation config's (one id or a list), the config's. A chat model often lists
    several (end of turn and end of text): a response stops at any of them. Pad: the
    argument, the tokenizer's, the config's, the first EOS, then 0."""
    gen_cfg = getattr(model, "generation_config", None)
    eos = eos_token_id
    if eos is None:
        declared = (
            _id_list(getattr(tokenizer, "eos_token_id", None))
            + _id_list(getattr(gen_cfg, "eos_token_id", None))
            + _id_list(getattr(model.config, "eos_token_id", None))
        )
        eos = list(dict.fromkeys(declared))
    eos_ids = _token_ids(eos, "eos_token_id", vocab_size)
    pad = _first_set(
        pad_token_id,
        getattr(tokenizer, "pad_token_id", None),
        getattr(model.config, "pad_token_id", None),
        eos_ids[0] if eos_ids else None,
        0,
    )
    (pad_id,) = _token_ids(pad, "pad_token_id", vocab_size)
    return eos_ids, pad_id


class RolloutEngine:
    """Generates `n` samples per prompt from `model`, sharing its weights (no copy).

    `recipe` (an `Fp8Recipe`, its name, or None for high precision) is applied with
    `use_recipe` for the duration of each `generate`; the model must have been converted
    with `convert_to_fp8` for an FP8 recipe. In no-grad mode the Fp8Linear layers cache
    their quantized weights keyed on the weight version, so an optimizer step is picked up
    by the next `generate` without any explicit sync.

    `eos_token_id` (one id or several) defaults to every EOS id the tokenizer, the model's
    generation config and its config declare (`special_token_ids`); without one (or with
    `eos_token_id=[]`), every response runs to max_new_tokens. `pad_token_id` defaults to
    the tokenizer's, the config's, the first EOS, then 0.

    `decode`: "eager" (a fresh cache per call), "static" (persistent buffers reused while
    the shapes repeat), "graph" (static, each decode step a replayed CUDA graph; CUDA only),
    or "auto": graph on CUDA (static for a MoE model: its expert loop follows the routing),
    static elsewhere.

    `kv_cache`: "model" (keys and values in the model's dtype) or "fp8" (stored in e4m3 with
    per-layer, per-KV-head scales; `calibrate_kv` sets them, and `generate` recalibrates from
    its prompts whenever the weights changed since: docs/rollout.md, "FP8 KV cache").
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        *,
        recipe=None,
        pad_token_id: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        decode: str = "auto",
        kv_cache: str = "model",
    ):
        if decode not in DECODE_MODES:
            raise ValueError(f"RolloutEngine: decode = {decode!r} must be one of {DECODE_MODES}")
        if kv_cache not in KV_CACHE_DTYPES:
            raise ValueError(
                f"RolloutEngine: kv_cache = {kv_cache!r} must be one of {KV_CACHE_DTYPES}"
            )
        self.kv_cache = kv_cache
        self.kv_scales = KVScales() if kv_cache == "fp8" else None
        self._kv_calibrated_for = None  # the weights' fingerprint at the last calibration
        self.decode = decode
        self._decoders: dict[str, StaticDecoder] = {}
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"RolloutEngine: model must be a transformers causal LM, got {type(model).__name__}"
            )
        check_model_supported(model)
        self.model = model
        # a MoE layer's expert loop follows the routing (host syncs, varying shapes): no graph
        self._routed = any(is_fused_experts(m) for m in model.modules())
        self.tokenizer = tokenizer
        self.recipe = as_recipe(recipe)
        if self.recipe is not None and not fp8_linears(model):
            raise ValueError(
                f"RolloutEngine: recipe = {self.recipe!r} but the model has no Fp8Linear "
                "layers: call fp8rl.fp8.convert_to_fp8(model, recipe) first"
            )
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids, self.pad_token_id = special_token_ids(
            model, tokenizer, self.vocab_size, eos_token_id, pad_token_id
        )

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def generate(
        self, prompts, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """Sample `params.n` responses for each prompt (strings or token-id lists).

        Reproducible from `generator` (its state advances); None uses torch's default one.
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"generate: params must be a SamplingParams, got {type(params).__name__}"
            )
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                "generate: generator must be a torch.Generator or None, "
                f"got {type(generator).__name__}"
            )
        ids = encode_prompts(prompts, self.tokenizer, self.vocab_size)
        prompt_ids, prompt_mask = left_pad(ids, self.pad_token_id, self.device)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and prompt_ids.shape[1] + params.max_new_tokens > limit:
            # RoPE past the trained range gives silently wrong log-probs, not an error
            raise ValueError(
                f"generate: the longest prompt ({prompt_ids.shape[1]} tokens) plus "
                f"max_new_tokens={params.max_new_tokens} exceeds the model's "
                f"max_position_embeddings={limit}"
            )
        check_window(self.model.config, prompt_ids.shape[1] + params.max_new_tokens)
        mode = self.decode_mode()
        was_training = self.model.training
        self.model.eval()  # dropout would make the recorded log-probs not those sampled from
        try:
            with torch.no_grad(), use_recipe(self.model, self._run_recipe(mode)):
                if self.kv_scales is not None and self._kv_calibrated_for != self._weights_key():
                    self._calibrate(prompt_ids, prompt_mask)
                if mode == "eager":
                    out = self._sample(prompt_ids, prompt_mask, params, generator)
                else:
                    out = self._decoder(mode).run(
                        prompt_ids,
                        prompt_mask,
                        params,
                        generator,
                        eos_ids=self.eos_token_ids,
                        pad_id=self.pad_token_id,
                        vocab=self.vocab_size,
                        check_finite=mode == "graph"
                        and self.recipe is not None
                        and self.recipe.check_finite,
                    )
        finally:
            self.model.train(was_training)
        n = params.n
        lengths = out["response_mask"].sum(1)
        texts = None
        if self.tokenizer is not None:
            texts = decode_responses(self.tokenizer, out["response_ids"], lengths)
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, 0),
            prompt_mask=prompt_mask.repeat_interleave(n, 0),
            response_lengths=lengths,
            prompt_index=torch.arange(len(ids), device=self.device).repeat_interleave(n),
            texts=texts,
            temperature=params.score_temperature,
            pad_token_id=self.pad_token_id,
            top_p=1.0 if params.is_greedy else float(params.top_p),
            **out,
        )

    def calibrate_kv(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Set the FP8 KV cache's scales from one forward of the current weights over a
        left-padded batch (B, S) (e.g. the last step's prompts and responses), under the
        rollout's recipe: per layer and KV head, amax of the keys and values of the valid
        positions, times the margin, / 448. `generate` then keeps them until the weights change.
        """
        if self.kv_scales is None:
            raise ValueError("calibrate_kv: the engine has kv_cache = 'model', no KV scales")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), use_recipe(self.model, self._run_recipe(self.decode_mode())):
                self._calibrate(input_ids.to(self.device), attention_mask.to(self.device))
        finally:
            self.model.train(was_training)

    def _calibrate(self, input_ids, attention_mask) -> None:
        self.kv_scales.set_from_amax(kv_amax(self.model, input_ids, attention_mask))
        self._kv_calibrated_for = self._weights_key()

    def _weights_key(self) -> tuple:
        # an optimizer step moves every version counter, a load or `.data =` moves a storage;
        # writes through `.data` move neither: `sync_weights(force=True)` marks scales stale
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def _new_cache(self, max_len: int):
        if self.kv_scales is None:
            return StaticKVCache(max_len)
        return Fp8KVCache(max_len, self.kv_scales)

    def decode_mode(self) -> str:
        """The decode path `generate` takes now ("auto" resolved for the model's device)."""
        cuda = self.device.type == "cuda"
        if self.decode == "auto":
            return "graph" if cuda and not self._routed else "static"
        if self.decode == "graph" and not cuda:
            raise ValueError(
                "RolloutEngine: decode = 'graph' needs the model on a CUDA device, "
                f"it is on {self.device}"
            )
        return self.decode

    def _run_recipe(self, mode: str):
        # a capture cannot host-sync per quantization: the graph path checks finiteness once,
        # at the end
        if mode == "graph" and self.recipe is not None and self.recipe.check_finite:
            return self.recipe.replace(check_finite=False)
        return self.recipe

    def _decoder(self, mode: str) -> StaticDecoder:
        if mode not in self._decoders:
            graph = mode == "graph"
            self._decoders[mode] = StaticDecoder(
                self.model,
                graphs=CudaGraphs() if graph else None,
                check_every=16 if graph else 1,
                bucket=64 if graph else 1,
                make_cache=self._new_cache,
            )
        return self._decoders[mode]

    def release_buffers(self) -> None:
        """Free the static decode buffers and graphs (e.g. to give their memory to training)."""
        self._decoders.clear()

    def _sample(self, prompt_ids, prompt_mask, params: SamplingParams, generator) -> dict:
        device, n, steps = self.device, params.n, params.max_new_tokens
        rows, width = prompt_ids.shape
        batch = rows * n
        dtype = self.model.get_input_embeddings().weight.dtype
        # the last sampled token is never fed back, so the cache needs width + steps - 1 slots
        cache = self._new_cache(width + steps - 1)

        # prefill each prompt once, then give each of its n samples a copy of its cache; exact
        # under every FP8 recipe too (repeating rows changes no tensorwise amax)
        logits = forward_step(
            self.model,
            prompt_ids,
            position_ids(prompt_mask),
            additive(causal_allowed(prompt_mask, cache.max_len), dtype),
            cache,
            torch.arange(width, device=device),
        )
        cache.repeat_rows(n)
        logits = logits.repeat_interleave(n, 0)

        key_valid = torch.zeros(batch, cache.max_len, dtype=torch.bool, device=device)
        key_valid[:, :width] = prompt_mask.repeat_interleave(n, 0)
        step_mask = additive(key_valid, dtype)[:, None, None, :]  # opened one slot per step
        positions = prompt_mask.sum(1).repeat_interleave(n)[:, None]
        slot = torch.zeros(1, dtype=torch.long, device=device)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        pad = torch.full((batch,), self.pad_token_id, dtype=torch.long, device=device)

        response_ids = torch.full(
            (batch, steps), self.pad_token_id, dtype=torch.long, device=device
        )
        response_mask = torch.zeros(batch, steps, dtype=torch.bool, device=device)
        log_probs = torch.zeros(batch, steps, dtype=torch.float32, device=device)
        entropy = torch.zeros(batch, steps, dtype=torch.float32, device=device)
        truncating = params.top_p < 1.0 and not params.is_greedy
        full_log_probs = torch.zeros(batch, steps, dtype=torch.float32, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens, done = (
            pad,
            0,
        )  # step 0 samples from the prefill's logits; later steps feed tokens back
        for t in range(steps):
            if t > 0:
                slot.fill_(width + t - 1)
                step_mask[..., width + t - 1] = 0
                logits = forward_step(
                    self.model, tokens[:, None], positions, step_mask, cache, slot
                )
                positions += 1
            tokens, lp, ent, full = sample_next(logits, params, generator, with_full=True)
            alive = ~finished
            tokens = torch.where(alive, tokens, pad)
            response_ids[:, t] = tokens
            response_mask[:, t] = alive
            log_probs[:, t] = lp.masked_fill(finished, 0.0)
            entropy[:, t] = ent.masked_fill(finished, 0.0)
            if truncating:
                full_log_probs[:, t] = full.masked_fill(finished, 0.0)
            done = t + 1
            if eos.numel():
                finished |= torch.isin(tokens, eos)
                if bool(finished.all()):
                    break
        out = {
            "response_ids": response_ids[:, :done],
            "response_mask": response_mask[:, :done],
            "log_probs": log_probs[:, :done],
            "entropy": entropy[:, :done],
            "truncated": ~finished,
        }
        if truncating:
            out["full_log_probs"] = full_log_probs[:, :done]
        return out

    def sync_weights(self, *, force: bool = False) -> int:
        """Re-quantize, now, the FP8 weights that changed since they were last quantized.

        `generate` would do it lazily on its first forward; calling this right after an
        optimizer step moves the work off the rollout's clock. `force=True` re-quantizes
        every layer (after writes through `weight.data`, which bypass the version counter)
        and, with an FP8 KV cache, makes the next `generate` recalibrate its scales.
        Returns how many layers re-quantized: 0 in high precision and when nothing changed.
        """
        if force:
            self._kv_calibrated_for = None  # `.data` writes bypass the fingerprint too
        if self.recipe is None:
            return 0
        return requantize(self.model, self._run_recipe(self.decode_mode()), force=force)
