"""FP8 coverage of a checkpoint under the `model.keep_high_precision` choices: the share of its
linear layers' GEMM FLOPs per token (sum of in x out) that a run leaves in FP8.

    OMP_NUM_THREADS=1 python bench/fp8_coverage.py [--model /work/models/smollm2-135m-instruct]

Builds the model as `fp8rl train` does (load_pretrained, fp32) and converts it at the run's one
seam (`config.precision.prepare_model`) once per choice and precision; nothing is generated.
Prints a markdown table and writes docs/real-model/fp8-coverage.json.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import _srcpath  # noqa: F401  (this checkout's src/ first)
from fp8rl.config.keep_precision import KeepHighPrecisionConfig
from fp8rl.config.precision import prepare_model
from fp8rl.models import load_pretrained
from fp8rl.utils import atomic_write_text

OUT = Path(__file__).resolve().parents[1] / "docs" / "real-model" / "fp8-coverage.json"
PRECISIONS = ("fp8-rowwise", "fp8-blockwise", "mxfp8")
CHOICES = {  # name -> model.keep_high_precision
    "default (lm_head kept)": {},
    "lm_head quantized": {"lm_head": False},
    "first 2 + last 2 blocks kept": {"first_blocks": 2, "last_blocks": 2},
    "down_proj kept": {"down_proj": True},
    "first 2 + last 2 blocks + down_proj kept": {
        "first_blocks": 2,
        "last_blocks": 2,
        "down_proj": True,
    },
}


def measure(model, precision: str, options: dict) -> dict:
    keep = KeepHighPrecisionConfig(**options).policy()
    problems = keep.problems(model)
    if problems:
        raise SystemExit(f"fp8_coverage: {precision} {options}: {problems}")
    report = prepare_model(copy.deepcopy(model), precision, precision, keep)
    macs = {n: a * b for n, (a, b) in report.dims.items()}
    fp8 = sum(macs[n] for n in (*report.converted, *report.updated))
    return {
        "precision": precision,
        "keep_high_precision": options,
        "fp8_coverage": report.coverage,
        "fp8_macs_per_token": fp8,
        "total_macs_per_token": sum(macs.values()),
        "layers_converted": len(report.converted),
        "layers_kept": len(report.skipped),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/work/models/smollm2-135m-instruct")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    model, _ = load_pretrained(a.model, dtype="float32")
    rows = [
        {"choice": name, **measure(model, p, options)}
        for name, options in CHOICES.items()
        for p in PRECISIONS
    ]
    c = model.config
    shape = {
        k: getattr(c, k)
        for k in ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size")
    }
    shape.update(
        kv_width=c.num_key_value_heads * (c.hidden_size // c.num_attention_heads),
        vocab_size=c.vocab_size,
    )
    out = {"model": Path(a.model).name, "shape": shape, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"{out['model']}: {shape}")
    print("| keep_high_precision | FP8 coverage | layers in FP8 / kept | precisions |")
    print("| --- | --- | --- | --- |")
    for name in CHOICES:
        same = [r for r in rows if r["choice"] == name]
        covs = {round(100 * r["fp8_coverage"], 2) for r in same}
        cov = " / ".join(f"{v:.2f} %" for v in sorted(covs))
        r = same[0]
        precisions = ", ".join(x["precision"] for x in same)
        print(f"| {name} | {cov} | {r['layers_converted']} / {r['layers_kept']} | {precisions} |")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
