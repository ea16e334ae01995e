"""FP8's per-token error on a real pretrained model, forward only (docs/real-model.md, "FP8 noise
on the real model"): the fp32 model samples responses, and the quantized model's log-probs of
the same tokens are compared with the fp32 ones, overall, by probability and entropy band, and
after each decoder block; one block quantized at a time says where the error enters.

    python -m fp8rl.study.real_noise select   # seeds 100-101: the kept layers, by the rule
    python -m fp8rl.study.real_noise probe    # seeds 1-3: bands and per-block profile
    python -m fp8rl.study.real_noise table docs/real-model/noise

The probes write JSON under docs/real-model/noise/; `table` recomputes the doc's tables from
those files and the two sweeps' committed runs (configs/real-model-noise*.yaml).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from ..config.precision import recipe_for
from ..fp8 import KeepHighPrecision, convert_to_fp8
from ..fp8.convert import named_fp8_linears
from ..fp8.keep import decoder_blocks, gemm_macs, linear_layers
from ..models import load_pretrained
from ..rollout import RolloutEngine, SamplingParams
from ..rollout.logprobs import compute_log_probs
from ..tasks import chat_task, get_task, prompt_inputs
from ..utils import atomic_write_text, run_main
from .real_noise_table import plot_profile, tables

RECIPES = ("fp8-rowwise", "fp8-tensorwise", "fp8-blockwise", "mxfp8")
PROB_BANDS = ((0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 1.0 + 1e-9))
ENTROPY_BANDS = ((0.0, 0.1), (0.1, 1.0), (1.0, math.inf))
TARGET_NMAE, MIN_COVERAGE = 0.03, 0.5  # the protocol's rule
OUT = Path("docs/real-model/noise")
MODEL = "models/smollm2-135m-instruct"


# ------------------------------------------------------------------ sampling and forwards


def sample_batch(model, tokenizer, seed: int, prompts: int = 4, n: int = 4, tokens: int = 48):
    """`prompts` train problems of the runs' task (picked by `seed`) x `n` responses sampled
    by the high-precision model at temperature 1."""
    task = chat_task(
        get_task("arithmetic_qa", ops="+*", digits=1), tokenizer, system_prompt="default"
    )
    chosen = random.Random(seed).sample(task.samples("train"), prompts)
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=tokens)
    engine = RolloutEngine(model, tokenizer)
    return engine.generate(
        prompt_inputs(chosen), params, generator=torch.Generator().manual_seed(seed)
    )


@contextmanager
def block_outputs(model, blocks: tuple[str, int]):
    """The output hidden state of every decoder block during the forwards inside."""
    layers = model.get_submodule(blocks[0])
    seen: list[torch.Tensor] = [None] * blocks[1]

    def hook(k):
        def keep(_mod, _inputs, out):
            seen[k] = (out[0] if isinstance(out, tuple) else out).detach()

        return keep

    handles = [layers[k].register_forward_hook(hook(k)) for k in range(blocks[1])]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def forward(model, batch, blocks) -> dict:
    """Log-probs, entropy and (response positions only) each block's hidden state."""
    with torch.no_grad(), block_outputs(model, blocks) as seen:
        lp, entropy = compute_log_probs(model, batch, with_entropy=True)
    t = batch.response_ids.shape[1]
    hidden = []
    for h in seen:
        if h is None or h.shape[1] < t:
            raise RuntimeError("real_noise: a decoder block's output was not seen in the forward")
        hidden.append(h[:, -t:])  # the response tokens' positions close the sequence
    return {"lp": lp, "entropy": entropy, "hidden": hidden}


# ------------------------------------------------------------------ statistics


def nmae(lp, lp_ref, mask) -> float:
    """sum |p - p_ref| / sum p_ref over the masked tokens (shadow/nmae_prob's definition)."""
    p, p_ref = lp.double().exp()[mask], lp_ref.double().exp()[mask]
    return float((p - p_ref).abs().sum() / p_ref.sum()) if p.numel() else math.nan


def banded(lp, ref: dict, mask, key: str, bands) -> list[dict]:
    """The NMAE of the tokens whose reference value (`prob` or `entropy`) lies in each band."""
    value = ref["lp"].exp() if key == "prob" else ref["entropy"]
    out = []
    for lo, hi in bands:
        m = mask & (value >= lo) & (value < hi)
        out.append({"band": [lo, hi], "tokens": int(m.sum()), "nmae": nmae(lp, ref["lp"], m)})
    return out


def hidden_errors(hidden, hidden_ref, mask) -> list[float]:
    """Per block: root mean square over response tokens of |h - h_ref| / |h_ref|."""
    out = []
    for h, r in zip(hidden, hidden_ref, strict=True):
        rel = (h - r).double().norm(dim=-1) / r.double().norm(dim=-1).clamp_min(1e-30)
        out.append(float(rel[mask].pow(2).mean().sqrt()))
    return out


# ------------------------------------------------------------------ which layers are in FP8


def quantized_copy(model, precision: str):
    """A copy with every linear layer (the lm_head too) converted to `precision`; `keep_only`
    then switches the kept ones back to high precision without another conversion."""
    q = copy.deepcopy(model)
    convert_to_fp8(q, recipe_for(precision), keep=KeepHighPrecision(lm_head=False))
    return q


def apply_keep(qmodel, precision: str, keep: KeepHighPrecision, blocks) -> None:
    """The kept layers compute in high precision, every other one in `precision`."""
    recipe = recipe_for(precision)
    for name, layer in named_fp8_linears(qmodel):
        layer.recipe = None if keep.why(name, blocks) else recipe


def coverage(model, keep: KeepHighPrecision, blocks) -> float:
    """Share of the linear layers' GEMM FLOPs per token left in FP8."""
    total = fp8 = 0
    for name, lin in linear_layers(model):
        macs = gemm_macs(lin.in_features, lin.out_features)
        total += macs
        fp8 += 0 if keep.why(name, blocks) else macs
    return fp8 / total


def only_block(k: int, n_blocks: int) -> KeepHighPrecision:
    """Every layer kept but block k's."""
    return KeepHighPrecision(lm_head=True, first_blocks=k, last_blocks=n_blocks - 1 - k)


def block_profile(qmodel, precision, batches, refs, blocks) -> list[float]:
    """Per block k: the mean over seeds of the NMAE with block k alone quantized."""
    out = []
    for k in range(blocks[1]):
        apply_keep(qmodel, precision, only_block(k, blocks[1]), blocks)
        errs = [
            nmae(forward(qmodel, b, blocks)["lp"], r["lp"], b.response_mask)
            for b, r in zip(batches, refs, strict=True)
        ]
        out.append(sum(errs) / len(errs))
    return out


def candidates(top: list[int], blocks) -> dict[str, KeepHighPrecision]:
    """The protocol's candidate exception sets; `top`: blocks by single-block NMAE, worst first."""
    pat = blocks[0] + ".{}.*"
    down = blocks[0] + ".{}.*down_proj"
    c = {"default (lm_head)": KeepHighPrecision()}
    for n in (1, 2, 4):
        c[f"first {n} blocks"] = KeepHighPrecision(first_blocks=n)
        c[f"last {n} blocks"] = KeepHighPrecision(last_blocks=n)
    c["first 2 + last 2 blocks"] = KeepHighPrecision(first_blocks=2, last_blocks=2)
    c["down_proj"] = KeepHighPrecision(down_proj=True)
    c["down_proj + first 2 + last 2"] = KeepHighPrecision(
        down_proj=True, first_blocks=2, last_blocks=2
    )
    for k in (1, 2, 4):
        worst = sorted(top[:k])
        c[f"worst {k} blocks {worst}"] = KeepHighPrecision(
            modules=tuple(pat.format(i) for i in worst)
        )
        c[f"down_proj of worst {k} {worst}"] = KeepHighPrecision(
            modules=tuple(down.format(i) for i in worst)
        )
    return c


def choose(rows: list[dict]) -> dict:
    """The protocol's rule over rows with "nmae" (mean over seeds) and "coverage"."""
    good = [r for r in rows if r["nmae"] <= TARGET_NMAE]
    if good:
        return {**max(good, key=lambda r: r["coverage"]), "target_reached": True}
    wide = [r for r in rows if r["coverage"] >= MIN_COVERAGE]
    return {**min(wide, key=lambda r: r["nmae"]), "target_reached": False}


# ------------------------------------------------------------------ the probes


def _setup(model_dir: str, seeds):
    model, tokenizer = load_pretrained(model_dir, dtype="float32")
    model.eval()
    blocks = decoder_blocks(model)
    batches = [sample_batch(model, tokenizer, s) for s in seeds]
    refs = [forward(model, b, blocks) for b in batches]
    return model, blocks, batches, refs


def _keep_dict(keep: KeepHighPrecision) -> dict:
    """As `model.keep_high_precision` takes it in a config."""
    return {
        "lm_head": keep.lm_head,
        "first_blocks": keep.first_blocks,
        "last_blocks": keep.last_blocks,
        "down_proj": keep.down_proj,
        "modules": list(keep.modules),
    }


def select(model_dir: str, seeds=(100, 101), out: Path = OUT) -> dict:
    """Item 1 of the protocol: the candidates' NMAE (rowwise) and the rule's choice."""
    model, blocks, batches, refs = _setup(model_dir, seeds)
    qmodel = quantized_copy(model, "fp8-rowwise")
    profile = block_profile(qmodel, "fp8-rowwise", batches, refs, blocks)
    top = sorted(range(len(profile)), key=lambda k: -profile[k])
    rows = []
    for name, keep in candidates(top, blocks).items():
        apply_keep(qmodel, "fp8-rowwise", keep, blocks)
        per_seed = [
            nmae(forward(qmodel, b, blocks)["lp"], r["lp"], b.response_mask)
            for b, r in zip(batches, refs, strict=True)
        ]
        row = {"name": name, "keep_high_precision": _keep_dict(keep), "per_seed": per_seed}
        row.update(nmae=sum(per_seed) / len(per_seed), coverage=coverage(model, keep, blocks))
        rows.append(row)
        print(
            f"{name}: NMAE {100 * row['nmae']:.2f} %, FP8 {100 * row['coverage']:.2f} %",
            file=sys.stderr,
        )
    result = {
        "seeds": list(seeds),
        "precision": "fp8-rowwise",
        "tokens": [int(b.response_mask.sum()) for b in batches],
        "single_block_nmae": profile,
        "rows": rows,
        "chosen": choose(rows),
    }
    _write(out / "selection.json", result)
    return result


def _cell(qmodel, precision, keep, blocks, batches, refs) -> list[dict]:
    apply_keep(qmodel, precision, keep, blocks)
    per_seed = []
    for b, ref in zip(batches, refs, strict=True):
        got, mask = forward(qmodel, b, blocks), b.response_mask
        per_seed.append(
            {
                "tokens": int(mask.sum()),
                "nmae": nmae(got["lp"], ref["lp"], mask),
                "by_prob": banded(got["lp"], ref, mask, "prob", PROB_BANDS),
                "by_entropy": banded(got["lp"], ref, mask, "entropy", ENTROPY_BANDS),
                "hidden_error": hidden_errors(got["hidden"], ref["hidden"], mask),
            }
        )
    return per_seed


def probe(model_dir: str, seeds=(1, 2, 3), out: Path = OUT) -> dict:
    """Item 3 of the protocol: per recipe and exception set, the banded NMAE and the
    per-block hidden-state error; rowwise, the single-block NMAE."""
    chosen = json.loads((out / "selection.json").read_text(encoding="utf-8"))["chosen"]
    sets = {
        "default": KeepHighPrecision(),
        "chosen": KeepHighPrecision(
            **{
                **chosen["keep_high_precision"],
                "modules": tuple(chosen["keep_high_precision"]["modules"]),
            }
        ),
    }
    model, blocks, batches, refs = _setup(model_dir, seeds)
    cells = {}
    for precision in RECIPES:
        qmodel = quantized_copy(model, precision)
        for set_name, keep in sets.items():
            cells[f"{precision}/{set_name}"] = _cell(qmodel, precision, keep, blocks, batches, refs)
            print(f"{precision}/{set_name} done", file=sys.stderr)
        if precision == "fp8-rowwise":
            profile = block_profile(qmodel, precision, batches, refs, blocks)
        del qmodel
    result = {
        "seeds": list(seeds),
        "chosen": chosen["name"],
        "cells": cells,
        "single_block_nmae": profile,
    }
    _write(out / "probe.json", result)
    return result


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.real_noise")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("select", "probe"):
        s = sub.add_parser(name)
        s.add_argument("--model", default=MODEL, help="the converted real model's folder")
        s.add_argument("--seeds", type=int, nargs="+")
        s.add_argument("--out", default=str(OUT))
    t = sub.add_parser("table")
    t.add_argument("folder", nargs="?", default=str(OUT))
    t.add_argument("--plot", action="store_true", help="also write FOLDER/profile.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.command == "table":
        print(tables(Path(a.folder)))
        if a.plot:
            probe_data = json.loads((Path(a.folder) / "probe.json").read_text(encoding="utf-8"))
            print(
                f"wrote {plot_profile(probe_data, Path(a.folder) / 'profile.png')}", file=sys.stderr
            )
    elif a.command == "select":
        select(a.model, tuple(a.seeds or (100, 101)), Path(a.out))
    else:
        probe(a.model, tuple(a.seeds or (1, 2, 3)), Path(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
