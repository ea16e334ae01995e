"""The tables of docs/real-model.md, "FP8 noise on the real model", recomputed from the committed
outputs in one folder: selection.json and probe.json (study/real_noise.py) and the two sweeps'
exported runs, runs-default/ and runs-keep/ (configs/real-model-noise.yaml and -keep.yaml).

    python -m fp8rl.study.real_noise table docs/real-model/noise
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..utils import save_figure
from .run_checks import IncompleteRunsError, sweep_spec
from .sweep.aggregation import aggregate_runs
from .sweep.stats import summarize_seeds

SWEEPS = {"default": "runs-default", "chosen": "runs-keep"}
PROFILE_BLOCKS = (1, 2, 5, 10, 15, 20, 25, 30)  # 1-based: after block k
EXTRA = "extra clips: lower, A<0 (%)"


def _read(path: Path) -> dict:
    if not path.is_file():
        raise IncompleteRunsError(f"{path} not found: run `python -m fp8rl.study.real_noise` first")
    data = json.loads(path.read_text(encoding="utf-8"))
    return data


def _fmt(values, scale: float = 1.0, digits: int = 2) -> str:
    """mean +- SE over seeds; "-" where no seed has a finite value."""
    s = summarize_seeds([None if v is None else v * scale for v in values])
    if s["mean"] is None:
        return "-"
    se = f" ± {s['se']:.{digits}f}" if s["se"] is not None else ""
    return f"{s['mean']:.{digits}f}{se}"


def _finite(*values) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def _extra_share(per: dict) -> list:
    """Per seed: FP8's extra lower clips of negative tokens over its extra clips of any kind."""
    out = []
    for lf, lb, cf, cb in zip(
        per["shadow/clipfrac_lower_neg_fp8"],
        per["shadow/clipfrac_lower_neg_bf16"],
        per["shadow/clipfrac_fp8"],
        per["shadow/clipfrac_bf16"],
        strict=True,
    ):
        ok = _finite(lf, lb, cf, cb) and cf - cb > 0
        out.append((lf - lb) / (cf - cb) if ok else None)
    return out


COLUMNS = (
    ("NMAE (%)", "shadow/nmae_prob", 100.0),
    ("NMAE quotient", "shadow/nmae_quotient", 1.0),
    ("clip FP8 (%)", "shadow/clipfrac_fp8", 100.0),
    ("clip BF16 (%)", "shadow/clipfrac_bf16", 100.0),
    (EXTRA, None, 100.0),
    (
        "lower clips in top-10 %-entropy responses (%)",
        "shadow/high_entropy_lower_clip_share",
        100.0,
    ),
)


def diagnostics(folder: Path) -> str:
    """The sweeps' shadow statistics, one row per recipe and exception set."""
    head = "| recipe | kept in high precision | seeds | " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 3) + "|"]
    for set_name, sub in SWEEPS.items():
        out = folder / sub
        agg = aggregate_runs(sweep_spec(out), out)
        for arm, a in agg["arms"].items():
            per = {k: v["per_seed"] for k, v in a["metrics"].items()}
            cells = [
                _fmt(_extra_share(per) if key is None else per.get(key, [None]), scale)
                for _, key, scale in COLUMNS
            ]
            lines.append(f"| {arm} | {set_name} | {len(a['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def selection(sel: dict) -> str:
    lines = [
        f"Seeds {sel['seeds']}, {sel['precision']}, response tokens {sel['tokens']}.",
        "",
        "| kept in high precision | NMAE (%) | FP8 coverage (%) |",
        "|---|---|---|",
    ]
    for r in sorted(sel["rows"], key=lambda r: -r["coverage"]):
        mark = " **(chosen)**" if r["name"] == sel["chosen"]["name"] else ""
        lines.append(f"| {r['name']}{mark} | {100 * r['nmae']:.2f} | {100 * r['coverage']:.2f} |")
    reached = "reached" if sel["chosen"]["target_reached"] else "not reached by any candidate"
    lines += ["", f"The 3 % target: {reached}."]
    return "\n".join(lines)


def bands(probe: dict) -> str:
    """NMAE by the sampled token's probability band and entropy band, mean +- SE over seeds."""
    first = next(iter(probe["cells"].values()))  # every cell scores the same tokens
    keys = [(key, i) for key in ("by_prob", "by_entropy") for i in range(len(first[0][key]))]
    names = [
        ("p" if key == "by_prob" else "H") + " {:g}-{:g}".format(*first[0][key][i]["band"])
        for key, i in keys
    ]
    lines = [
        "| recipe | kept | all | " + " | ".join(names) + " |",
        "|---" * (len(names) + 3) + "|",
    ]
    for cell, per_seed in probe["cells"].items():
        recipe, kept = cell.split("/")
        cols = [_fmt([s["nmae"] for s in per_seed], 100.0)]
        cols += [_fmt([s[key][i]["nmae"] for s in per_seed], 100.0) for key, i in keys]
        lines.append(f"| {recipe} | {kept} | " + " | ".join(cols) + " |")
    tokens = [sum(s["tokens"] for s in first)]
    tokens += [sum(s[key][i]["tokens"] for s in first) for key, i in keys]
    lines.append("| tokens, all seeds | | " + " | ".join(map(str, tokens)) + " |")
    return "\n".join(lines)


def profile(probe: dict) -> str:
    """The hidden state's relative error after chosen blocks (mean over seeds, %)."""
    lines = [
        "| recipe | kept | " + " | ".join(f"after block {k}" for k in PROFILE_BLOCKS) + " |",
        "|---" * (len(PROFILE_BLOCKS) + 2) + "|",
    ]
    for cell, per_seed in probe["cells"].items():
        recipe, kept = cell.split("/")
        cols = [
            _fmt([s["hidden_error"][k - 1] for s in per_seed], 100.0, 1) for k in PROFILE_BLOCKS
        ]
        lines.append(f"| {recipe} | {kept} | " + " | ".join(cols) + " |")
    single = probe["single_block_nmae"]
    worst = sorted(range(len(single)), key=lambda k: -single[k])[:5]
    lines += [
        "",
        "Rowwise, one block quantized at a time (blocks numbered from 0), the five largest NMAE: "
        + ", ".join(f"block {k} {100 * single[k]:.2f} %" for k in worst)
        + f"; the median block {100 * sorted(single)[len(single) // 2]:.2f} %.",
    ]
    return "\n".join(lines)


def tables(folder: Path) -> str:
    """Every table of the doc's section, checking each input is there and complete."""
    sel = _read(folder / "selection.json")
    probe = _read(folder / "probe.json")
    return "\n\n".join(
        [
            "### Selection (seeds 100-101)\n\n" + selection(sel),
            "### Diagnostics at the shadow steps (seeds 1-3, steps 1-2)\n\n" + diagnostics(folder),
            "### NMAE by band (seeds 1-3, forward only)\n\n" + bands(probe),
            "### Where the error enters (seeds 1-3)\n\n" + profile(probe),
        ]
    )


def plot_profile(probe: dict, path: Path) -> Path:
    """Left: the hidden state's relative error after each block, per recipe and exception
    set (mean over seeds). Right: rowwise, the NMAE with one block alone quantized."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for cell, per_seed in probe["cells"].items():
        n = len(per_seed[0]["hidden_error"])
        mean = [100 * sum(s["hidden_error"][k] for s in per_seed) / len(per_seed) for k in range(n)]
        style = "-" if cell.endswith("/default") else "--"
        left.plot(range(1, n + 1), mean, style, label=cell)
    left.set_xlabel("after decoder block")
    left.set_ylabel("relative error of the hidden state (%)")
    left.set_title("where the error grows (dashed: chosen exceptions)")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    single = probe["single_block_nmae"]
    right.bar(range(len(single)), [100 * v for v in single])
    right.set_xlabel("the one quantized block (rowwise)")
    right.set_ylabel("per-token probability NMAE (%)")
    right.set_title("where the error enters")
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return Path(path)
