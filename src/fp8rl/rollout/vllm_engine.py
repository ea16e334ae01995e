"""`VllmRolloutEngine`: rollouts from vLLM running in the trainer's process, weights pushed
from the trainer in place (docs/rollout.md, "vLLM as the rollout engine")."""

from __future__ import annotations

import os
import tempfile
import time

import torch

from ..errors import ConfigError
from ..fp8 import fake_quantize, named_fp8_linears
from .batch import RolloutBatch
from .engine import special_token_ids
from .params import SamplingParams
from .prompts import decode_responses, encode_prompts, left_pad
from .vllm_options import default_options, require_vllm

SEED_RANGE = 1 << 31  # vLLM's per-request seeds


def _one_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


class VllmRolloutEngine:
    """`generate` as `RolloutEngine`'s, sampled by a colocated `vllm.LLM`.

    The engine is built once from `model` (its config and current weights, written to a
    temporary folder with `save_pretrained`); prompts go in and responses come out as token
    ids, encoded and decoded with `tokenizer`, so any tokenizer the run uses works.
    `sync_weights` pushes the trainer's current weights into the live engine (vLLM's
    in-place reload, no rebuild); `generate` pushes them before its first rollout, and
    `sync_if_due(step)` every `sync_every` steps after that.

    `recipe` (the rollout recipe, or None): an FP8 recipe on CUDA runs vLLM's own FP8
    (`quantization: fp8`, re-quantized at every reload); elsewhere (the CPU build has no FP8
    kernel; the 4-bit and MX recipes) the pushed weights are the recipe's fake-quantized
    values, so the rollout carries the weights' quantization error but not the activations'.
    `options`: vllm.LLM keyword options over fp8rl's defaults (vllm_options.py).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        recipe=None,
        options: dict | None = None,
        seed: int = 0,
        sync_every: int = 1,
        eos_token_id=None,
        pad_token_id=None,
    ):
        require_vllm()
        self.model, self.tokenizer, self.recipe = model, tokenizer, recipe
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids, self.pad_token_id = special_token_ids(
            model, tokenizer, self.vocab_size, eos_token_id, pad_token_id
        )
        self.sync_every = sync_every
        device = self.device.type
        fp8_on_cuda = device == "cuda" and recipe is not None and recipe.block_format is None
        self.fake_quantized = recipe is not None and not fp8_on_cuda
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.options = {**default_options(dtype, device, seed, fp8_on_cuda), **(options or {})}
        self.llm = self._build()
        self.last_sync: int | None = None  # the step of the last push; None: not pushed yet
        self.synced = False
        self.sync_seconds: list[float] = []

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def describe(self) -> str:
        """One events.log line: what the engine runs in, and what of FP8 it carries."""
        o = self.options
        where = f"vllm.LLM on {self.device.type}, dtype {o.get('dtype')}"
        if self.recipe is None:
            return f"rollout.engine=vllm: {where}, high precision"
        if self.fake_quantized:
            why = (
                "the CPU build has no FP8 kernel"
                if self.device.type != "cuda"
                else "no vLLM kernel"
            )
            return (
                f"rollout.engine=vllm: {where}; {why}: the weights pushed are the "
                f"{self.recipe.name} recipe's fake-quantized values (weight-only quantization "
                "error, activations in high precision)"
            )
        return f"rollout.engine=vllm: {where}, quantization {o.get('quantization')} (vLLM's own)"

    def _build(self):
        # in-process engine core: the live model must be reachable for in-place reloads
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.device.type != "cuda":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, beside the trainer
        from vllm import LLM

        set_threads = torch.set_num_threads  # the CPU worker replaces it process-wide
        threads = torch.get_num_threads()
        try:
            with tempfile.TemporaryDirectory(prefix="fp8rl-vllm-") as folder:
                self.model.save_pretrained(folder, state_dict=dict(self._weights()))
                kw = {**self.options, **_fixed(folder)}
                try:
                    return LLM(**kw)
                except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:
                    raise ConfigError("rollout.vllm", self.options, _one_line(e)) from e
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)

    # ---------------------------------------------------------------- weights

    def _weights(self):
        """(name, tensor) of the trainer's weights as the engine should hold them."""
        fq = {}
        if self.fake_quantized:
            fq = {f"{name}.weight": m for name, m in named_fp8_linears(self.model)}
        with torch.no_grad():
            for name, t in self.model.state_dict().items():
                if name in fq:
                    t = fake_quantize(t, self.recipe, weight=True)
                yield name, t.detach()

    def sync_weights(self, step: int | None = None) -> float:
        """Push the trainer's current weights into the engine now; returns the seconds taken.
        Cached prefixes (KV of the old weights) are dropped."""
        t0 = time.perf_counter()
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": self._weights(), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()
        self.synced, self.last_sync = True, step
        seconds = time.perf_counter() - t0
        self.sync_seconds.append(seconds)
        return seconds

    def sync_if_due(self, step: int) -> float:
        """Push when `sync_every` steps have passed since the last push (or none happened in
        this process: a resumed run pushes its checkpoint's weights at its first step)."""
        due = self.last_sync is None or step - self.last_sync >= self.sync_every
        return self.sync_weights(step) if due else 0.0

    # ---------------------------------------------------------------- sampling

    def generate(
        self, prompts, params: SamplingParams, *, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """Sample `params.n` responses for each prompt (strings or token-id lists).

        Each prompt's request gets a seed drawn from `generator`, so a fixed generator gives
        the same rollout from the same weights (vLLM's per-request sampler)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"generate: params must be a SamplingParams, got {type(params).__name__}"
            )
        if params.is_greedy and params.score_temperature != 1.0:
            raise ValueError(
                "generate: the vLLM engine scores greedy decoding at temperature 1: "
                "use temperature=0 rather than greedy=True with a temperature"
            )
        if not self.synced:
            self.sync_weights()
        ids = encode_prompts(prompts, self.tokenizer, self.vocab_size)
        where = "cpu" if generator is None else generator.device
        seeds = torch.randint(0, SEED_RANGE, (len(ids),), generator=generator, device=where)
        outs = self.llm.generate(
            [{"prompt_token_ids": row} for row in ids],
            [self._vllm_params(params, int(s)) for s in seeds.tolist()],
            use_tqdm=False,
        )
        return self._batch(ids, outs, params)

    def sequence_log_probs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The engine's log-prob of each token of each sequence given the ones before it
        (temperature 1, float32; L - 1 values for L tokens): what its weights are now."""
        from vllm import SamplingParams as VllmParams

        if not self.synced:
            self.sync_weights()
        score = VllmParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(
            [{"prompt_token_ids": list(s)} for s in sequences], score, use_tqdm=False
        )
        return [
            torch.tensor([d[t].logprob for t, d in zip(s[1:], o.prompt_logprobs[1:], strict=True)])
            for s, o in zip(sequences, outs, strict=True)
        ]

    def _vllm_params(self, params: SamplingParams, seed: int):
        from vllm import SamplingParams as VllmParams

        return VllmParams(
            n=params.n,
            temperature=0.0 if params.is_greedy else float(params.temperature),
            top_p=float(params.top_p),
            max_tokens=params.max_new_tokens,
            seed=seed,
            # the sampled token's log-prob alone: the whole vocabulary's would cost a Python
            # object per entry and token (15-30x the rollout on a 32k vocabulary); the
            # entropy comes from the trainer's old-log-prob pass instead
            logprobs=0,
            stop_token_ids=list(self.eos_token_ids),
            detokenize=False,
        )

    def _batch(self, ids, outs, params: SamplingParams) -> RolloutBatch:
        rows = [(i, c) for i, out in enumerate(outs) for c in sorted(out.outputs, key=_index)]
        steps = max(1, max(len(c.token_ids) for _, c in rows))
        b = len(rows)
        response_ids = torch.full((b, steps), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros(b, steps, dtype=torch.bool)
        log_probs = torch.zeros(b, steps, dtype=torch.float32)
        truncated = torch.zeros(b, dtype=torch.bool)
        for r, (_, c) in enumerate(rows):
            tokens = list(c.token_ids)
            response_ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            response_mask[r, : len(tokens)] = True
            lps = [dist[token].logprob for token, dist in zip(tokens, c.logprobs, strict=True)]
            log_probs[r, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
            truncated[r] = c.finish_reason == "length"
        prompt_ids, prompt_mask = left_pad(ids, self.pad_token_id, self.device)
        n, device = params.n, self.device
        lengths = response_mask.sum(1)
        texts = None
        if self.tokenizer is not None:
            texts = decode_responses(self.tokenizer, response_ids, lengths)
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, 0),
            prompt_mask=prompt_mask.repeat_interleave(n, 0),
            response_ids=response_ids.to(device),
            response_mask=response_mask.to(device),
            log_probs=log_probs.to(device),
            entropy=None,  # the trainer's old-log-prob pass computes it (step/step.py)
            truncated=truncated.to(device),
            response_lengths=lengths.to(device),
            prompt_index=torch.arange(len(ids), device=device).repeat_interleave(n),
            texts=texts,
            temperature=params.score_temperature,
            pad_token_id=self.pad_token_id,
            # vLLM returns the nucleus' log-probs only: with top_p < 1 the batch has no
            # full-softmax ones, and TIS refuses it (config validation says so first)
            top_p=1.0 if params.is_greedy else float(params.top_p),
        )


def _index(completion) -> int:
    return completion.index


def _fixed(folder: str) -> dict:
    """FIXED_OPTIONS' values (vllm_options.py says why each is fp8rl's)."""
    return {
        "model": folder,
        "skip_tokenizer_init": True,
        "logprobs_mode": "processed_logprobs",
        "max_logprobs": 0,
    }
