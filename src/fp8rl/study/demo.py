"""`fp8rl demo`: warm start once, then a sweep (every arm x seed from that same start) of bf16,
vanilla FP8, and FP8 with Calibrated Clipping under the paper's rule and the pooled rule;
writes summary.json, summary.md and plots with bands over seeds."""

from __future__ import annotations

import json
import subprocess
import time
from importlib import resources
from pathlib import Path

import yaml

from ..config import config_from_dict, merge
from ..config.warmstart_file import info_path_of, verified_sha256
from ..config.yaml_strict import load_yaml
from ..errors import ConfigError
from ..train.warmstart import ensure_warm_start
from ..utils import atomic_write_text
from .sweep import run_sweep
from .sweep.plots import plot_sweep

SWEEP_KEYS = ("seeds", "skip_steps", "final_window")
# summary.json field -> (where in an arm's aggregate, key); "_mean" / "_se" are taken from it
PER_STEP = {
    "lower_clip_excess": "shadow/lower_clip_excess",
    "lower_clipfrac_neg_fp8": "shadow/lower_clipfrac_neg_fp8",
    "lower_clipfrac_neg_bf16": "shadow/lower_clipfrac_neg_bf16",
    "amplification": "shadow/amplification",
    "nmae_quotient": "shadow/nmae_quotient",
    "nmae_prob": "shadow/nmae_prob",
    "tis_weight": "actor/tis_weight_mean",
    "kl_rollout_train": "mismatch/kl_rollout_train",
    "entropy": "rollout/entropy",
}
SHADOW_FIELDS = (
    "lower_clip_excess",
    "lower_clipfrac_neg_fp8",
    "lower_clipfrac_neg_bf16",
    "amplification",
    "nmae_quotient",
    "nmae_prob",
)


def load_demo_spec(path: str | Path | None = None, quick: bool = False) -> dict:
    text = (
        Path(path).read_text()
        if path
        else resources.files("fp8rl").joinpath("configs/demo.yaml").read_text()
    )
    try:
        spec = load_yaml(text)
    except yaml.YAMLError as e:
        where = str(path or "configs/demo.yaml")
        raise ConfigError("--config", where, f"valid YAML ({' '.join(str(e).split())})") from e
    base = spec.get("base") if isinstance(spec, dict) else None
    if not isinstance(base, dict):  # an empty file is None; the sweep checks the rest
        where = str(path or "configs/demo.yaml")
        raise ConfigError("--config", where, "a demo spec: a mapping with a `base:` run config")
    if quick:
        q = spec.get("quick", {})
        spec["base"] = merge(spec["base"], q.get("base", {}))
        spec.update({k: q[k] for k in SWEEP_KEYS if k in q})
    model = spec.get("base", {}).get("model", {})
    ws = model.get("warm_start")
    if not path and isinstance(ws, str) and ws not in ("none", "auto") and not Path(ws).exists():
        # the packaged spec names the committed warm start by its path in the checkout:
        # `fp8rl demo` run from another folder of an editable install still finds it
        in_checkout = CHECKOUT / ws
        if in_checkout.is_file():
            model["warm_start"] = str(in_checkout)
    return spec


# the source checkout of an editable install (src/fp8rl/study/demo.py -> the repository root)
CHECKOUT = Path(__file__).resolve().parents[3]


def run_demo(
    out_dir: str | Path = "runs/demo",
    *,
    quick: bool = False,
    config: str | None = None,
    progress: bool = True,
    jobs: int | None = None,
) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    code = code_version()  # before the runs: an edit made while they run is not theirs
    spec = load_demo_spec(config, quick)
    ws_info = demo_warm_start(spec["base"], progress)
    sweep = {
        "base": spec["base"],
        "arms": spec["arms"],
        **{k: spec[k] for k in SWEEP_KEYS if k in spec},
    }
    agg = run_sweep(sweep, out, jobs=jobs, progress=progress)
    plots = plot_sweep(out, agg)
    summary = {
        "runs": {arm: arm_summary(a) for arm, a in agg["arms"].items()},
        "warm_start": ws_info,
        "code": code,
        "wall_s": time.perf_counter() - t0,
    }
    summary["excess_left"] = excess_left(summary["runs"])
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    atomic_write_text(out / "summary.md", summary_md(summary, spec, plots, quick))
    return summary


def demo_warm_start(base: dict, progress: bool) -> dict:
    """The info of the warm start every arm and seed starts from, with `weights` (its path)
    and `sha256`: a committed file (`model.warm_start: FILE`, checked against the sha256 its
    info records) or the cached one (`auto`: built here once, then loaded by every run)."""
    cfg = config_from_dict(base)
    mode = cfg.model.warm_start
    if cfg.model.init_weights or mode == "none":
        raise ConfigError("model.warm_start", mode, "'auto' or a warm-start file for the demo")
    if mode == "auto":
        path, info = ensure_warm_start(cfg, progress=progress)
        return {"weights": str(path), **info}
    digest = verified_sha256(mode)
    info_file = info_path_of(mode)
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    return {**info, "weights": mode, "sha256": digest}


def code_version() -> dict:
    """The commit of the source checkout the demo ran from, and the tracked files under src/,
    configs/ and docs/warmstarts/ that differed from it (numbers quoted in the docs must come
    from a run with none); both None outside a git checkout (an installed wheel)."""
    if not (CHECKOUT / "src" / "fp8rl").is_dir():
        return {"commit": None, "changed": None}
    git = ["git", "-C", str(CHECKOUT)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "changed": None}
    return {"commit": commit, "changed": sorted(line[3:] for line in changed)}


# what decides the demo's numbers: the code, the packaged and repository configs, warm starts
CODE_PATHS = ("src", "configs", "docs/warmstarts")


def arm_summary(a: dict) -> dict:
    """One arm of summary.json: per-step metrics as the mean over seeds of per-seed means over
    steps >= skip_steps (`_mean`) and their standard error over seeds (`_se`)."""
    shadow = a["metrics"].get("shadow/lower_clip_excess", {}).get("mean") is not None
    out: dict = {"seeds": a["seeds"]}
    for name, key in PER_STEP.items():
        if name in SHADOW_FIELDS and not shadow:
            continue  # no shadow passes in this arm (bf16)
        stats = a["metrics"].get(key, {})
        out[f"{name}_mean"], out[f"{name}_se"] = stats.get("mean"), stats.get("se")
        if name == "lower_clip_excess":
            out["lower_clip_excess_ci95"] = stats.get("ci95")
            out["lower_clip_excess_per_seed"] = stats.get("per_seed")
    for name in ("reward_final", "eval_final_mean@1"):
        stats = a["final"].get(name, {})
        out[f"{name}_mean"], out[f"{name}_se"] = stats.get("mean"), stats.get("se")
    out["wall_s"] = a["wall_s_total"]
    return out


def excess_left(runs: dict) -> dict:
    """The share of vanilla FP8's lower-clip excess each calibrated arm leaves (mean over seeds)."""
    ref = runs.get("fp8", {}).get("lower_clip_excess_mean")
    return {
        arm: (r["lower_clip_excess_mean"] / ref if ref else None)
        for arm, r in runs.items()
        if arm.startswith("fp8-") and "lower_clip_excess_mean" in r
    }


def _pp(mean, se=None, ci=None) -> str:
    if mean is None:
        return "-"
    text = f"{100 * mean:+.2f}" if ci is not None else f"{100 * mean:.2f}"
    if se is not None:
        text += f" ± {100 * se:.2f}"
    if ci is not None and None not in ci:
        text += f" [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"
    return text


def _num(mean, se=None, fmt="{:.3f}") -> str:
    if mean is None:
        return "-"
    return fmt.format(mean) + (" ± " + fmt.format(se) if se is not None else "")


def summary_md(summary: dict, spec: dict, plots: list, quick: bool) -> str:
    b, runs = spec["base"], summary["runs"]
    seeds = spec.get("seeds", [0])
    head = (
        "| arm | lower-clip excess of N, pp (mean ± SE [95 % CI]) "
        "| FP8 / BF16-shadow lower clips of N, % "
        "| amplification | NMAE quotient | TIS weight | reward, last 10 steps | entropy "
        "| greedy test accuracy | wall |"
    )
    steps = (b.get("train") or {}).get("steps")
    smoke = [
        f"A smoke test ({steps} steps x {len(seeds)} seeds): it shows that every stage of the "
        "pipeline runs, not what FP8 does; `fp8rl demo` without `--quick` gives the result.",
        "",
    ]
    lines = [
        "# fp8rl demo" + (" (quick)" if quick else ""),
        "",
        *(smoke if quick else []),
        f"{len(seeds)} seeds ({', '.join(map(str, seeds))}) per arm, paired: every run starts "
        "from the same warm start. Per-step numbers are per-seed means over steps >= "
        f"{spec.get('skip_steps', 1)}, then mean ± standard error over seeds.",
        "",
        head,
        "|---" * 10 + "|",
    ]
    lines += [_arm_row(arm, r) for arm, r in runs.items()]
    left = {} if quick else summary.get("excess_left", {})  # no share of a few steps' noise
    lines += [""] + [
        f"- `{arm}` leaves {100 * v:.0f} % of the vanilla `fp8` excess (mean over seeds)."
        for arm, v in left.items()
        if v is not None
    ]
    lines += _setup_lines(b, summary) + WHAT_TO_LOOK_AT
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _arm_row(arm: str, r: dict) -> str:
    clips = (
        f"{_pp(r['lower_clipfrac_neg_fp8_mean'])} / {_pp(r['lower_clipfrac_neg_bf16_mean'])}"
        if "lower_clipfrac_neg_fp8_mean" in r
        else "-"
    )
    cells = [
        _pp(
            r.get("lower_clip_excess_mean"),
            r.get("lower_clip_excess_se"),
            r.get("lower_clip_excess_ci95"),
        ),
        clips,
        _num(r.get("amplification_mean"), fmt="{:.2f}"),
        _num(r.get("nmae_quotient_mean"), fmt="{:.2f}"),
        _num(r.get("tis_weight_mean"), fmt="{:.4f}"),
        _num(r["reward_final_mean"], r["reward_final_se"]),
        _num(r["entropy_mean"], r["entropy_se"]),
        _pp(r["eval_final_mean@1_mean"], r["eval_final_mean@1_se"]) + " %",
        f"{r['wall_s']:.0f} s",
    ]
    return f"| {arm} | " + " | ".join(cells) + " |"


def _setup_lines(b: dict, summary: dict) -> list[str]:
    """The task, the batch and the schedule of the base config, and the warm start."""
    ws, code = summary["warm_start"], summary.get("code", {})
    return [
        "",
        f"Task: {b['task']['name']} {b['task'].get('options', {})}; tiny Qwen3; "
        f"{b['rollout']['prompts_per_step']} prompts x {b['rollout']['n']} samples per step, "
        f"{b['train']['mini_batches']} mini-batch updates per step, lr {b['train']['lr']}, "
        f"{b['train']['steps']} steps; rollout {b['rollout']['precision']}, training "
        f"{b['train']['precision']} (bf16 arm: high precision for both); shadow passes every "
        f"{b['calibration'].get('shadow_every')} step(s), bounds refit every "
        f"{b['calibration']['interval']}.",
        f"Warm start: `{ws.get('weights')}` (sha256 {str(ws.get('sha256'))[:16]}...), "
        f"{ws.get('steps')} supervised steps, greedy accuracy "
        f"{_pp(ws.get('train_accuracy'))} % (train) "
        f"and {_pp(ws.get('eval_mean@1'))} % (test). Demo wall time {summary['wall_s']:.0f} s.",
        f"Code: commit {code.get('commit')}"
        + (f", with changes to {', '.join(code['changed'])}" if code.get("changed") else "")
        + ".",
        "",
    ]


# what a reader should look for in the table and the plots
WHAT_TO_LOOK_AT = [
    "## What to look at",
    "- `fp8`, the lower-clip excess: how much more often FP8 ratios clip negative-advantage tokens",
    "  at the lower bound than the BF16 shadow ratios of the same weights "
    "(`shadow_lower_clip.png`).",
    "  A clipped token carries no gradient: this is the failure mode.",
    "- `fp8-calibrated` (pooled rule) and `fp8-calibrated-paper`: the excess left when the bounds",
    "  are refit from the shadow passes (`bounds.png` shows L and H).",
    "- amplification: mean |r/rhat - 1| over mean |p/phat - 1|, how much the ratio amplifies the",
    "  per-token FP8 error; the NMAE quotient is the paper's ratio of the two NMAEs.",
    "- TIS weight: rollout and trainer differ (in recipe, or in how batch-dependent scales see",
    "  the batch: see the precisions above), so TIS has a mismatch to correct.",
    "- reward, entropy and accuracy: at this scale and length they are not expected to separate.",
    "",
]


# The README's demo table and the numbers its text quotes, formatted from summary.json:
# tests/test_readme_demo.py fails when README.md holds other ones.
README_HEAD = (
    "| arm | FP8 lower-clip excess over the BF16 shadow (negative-advantage tokens) "
    "| 95 % interval | share of the vanilla excess left |"
)


def readme_table(summary: dict) -> list[str]:
    """The lines of the README's table: each arm with a lower-clip excess, its mean ± SE over
    seeds, the 95 % t-interval and the share of the vanilla `fp8` excess it leaves."""
    left = summary.get("excess_left", {})
    lines = [README_HEAD, "| --- | --- | --- | --- |"]
    for arm, r in summary["runs"].items():
        if r.get("lower_clip_excess_mean") is None:
            continue  # no shadow passes (bf16)
        excess = (
            f"{100 * r['lower_clip_excess_mean']:+.2f} ± {100 * r['lower_clip_excess_se']:.2f} pp"
        )
        if arm == "fp8":
            excess += (
                f" ({100 * r['lower_clipfrac_neg_fp8_mean']:.2f} % vs "
                f"{100 * r['lower_clipfrac_neg_bf16_mean']:.2f} %)"
            )
        lo, hi = r["lower_clip_excess_ci95"]
        share = f"{100 * left[arm]:.0f} %" if left.get(arm) is not None else "-"
        name = f"{arm} (pooled)" if arm == "fp8-calibrated" else arm
        lines.append(f"| {name} | {excess} | {100 * lo:+.2f} .. {100 * hi:+.2f} pp | {share} |")
    return lines


def readme_sentence(summary: dict) -> str:
    """The README's sentence that quotes the table: the share of negative-advantage tokens
    vanilla FP8 lower-clips against its BF16 shadow (and how many times as many, when the
    shadow clips any), and the share of that excess the pooled rule removes."""
    fp8 = summary["runs"]["fp8"]
    ours, shadow = fp8["lower_clipfrac_neg_fp8_mean"], fp8["lower_clipfrac_neg_bf16_mean"]
    times = f", {ours / shadow:.0f}x as many" if shadow else ""
    removed = 1 - summary["excess_left"]["fp8-calibrated"]
    return (
        f"FP8 ratio noise makes vanilla FP8 drop the gradient of {100 * ours:.2f} % of the "
        f"negative-advantage tokens where the same weights in high precision drop "
        f"{100 * shadow:.2f} %{times}, and Calibrated Clipping's pooled rule removes "
        f"{100 * removed:.0f} % of that excess."
    )
