"""bench/gpu_rollout.py's vLLM rows: `vllm.LLM` built from the benchmarked model's weights
(bf16, and vLLM's online FP8), timed on the same prompts."""

from __future__ import annotations

import importlib.util
import tempfile
import time

VLLM_PATHS = {"vllm bf16": None, "vllm fp8": "fp8"}  # row name -> vLLM's `quantization`


def vllm_engines(model, args, device) -> dict:
    """row name -> a `vllm.LLM` from `model`'s weights, or the reason there is none."""
    if importlib.util.find_spec("vllm") is None:
        return dict.fromkeys(VLLM_PATHS, "absent")
    if device.type != "cuda":
        return dict.fromkeys(VLLM_PATHS, "not run (CPU smoke)")
    from vllm import LLM

    out = {}
    with tempfile.TemporaryDirectory(prefix="gpu-rollout-vllm-") as folder:
        model.save_pretrained(folder)
        for name, quantization in VLLM_PATHS.items():
            try:
                out[name] = LLM(
                    model=folder,
                    skip_tokenizer_init=True,
                    dtype="bfloat16",
                    quantization=quantization,
                    gpu_memory_utilization=0.25,  # both engines beside fp8rl's model
                    max_model_len=args.prompt_len + args.new_tokens + 8,
                    seed=0,
                )
            except Exception as e:  # noqa: BLE001 - reported in its row, the rest runs
                out[name] = f"raised {type(e).__name__}: {e}"[:200]
    return out


def time_vllm(llm, prompts, new_tokens: int, repeats: int) -> tuple[float, float]:
    """(first call s, best tokens/s) of `llm.generate`, every response new_tokens long."""
    from vllm import SamplingParams as VllmParams

    params = VllmParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    t0 = time.perf_counter()
    llm.generate(requests, params, use_tqdm=False)
    first, best = time.perf_counter() - t0, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = llm.generate(requests, params, use_tqdm=False)
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        best = max(best, tokens / (time.perf_counter() - t0))
    return first, best
