"""`fp8rl demo`: warm start once, then GRPO from the same start in bf16, vanilla FP8 and
FP8 with Calibrated Clipping; writes summary.json, summary.md and plots."""

from __future__ import annotations

import hashlib
import json
import time
from importlib import resources
from pathlib import Path

import yaml

from ..rollout import RolloutEngine
from ..tasks import get_task
from ..utils import seed_everything
from .checkpoint import save_weights
from .config import _merge, config_from_dict
from .evaluate import evaluate_policy
from .model_setup import build_model
from .report import make_report, summarize

SUMMARY_FIELDS = ("reward_final", "entropy_mean", "clipfrac_lower_neg_mean", "steps", "wall_s")
FP8_FIELDS = ("shadow_clipfrac_bf16_mean", "shadow_clipfrac_fp8_mean", "shadow_nmae_prob_mean",
              "shadow_amplification_mean", "shadow_lower_clipfrac_neg_fp8_mean",
              "shadow_lower_clipfrac_neg_bf16_mean", "shadow_false_lower_clip_mean",
              "shadow_nmae_ratio_mean")


def load_demo_spec(path: str | Path | None = None, quick: bool = False) -> dict:
    text = (Path(path).read_text() if path else
            resources.files("fp8rl").joinpath("configs/demo.yaml").read_text())
    spec = yaml.safe_load(text)
    if quick:
        q = spec.get("quick", {})
        spec["warm_start"] = _merge(spec["warm_start"], q.get("warm_start", {}))
        spec["base"] = _merge(spec["base"], q.get("base", {}))
    return spec


def warm_start_weights(spec: dict, out_dir: Path, progress: bool = True) -> tuple[Path, dict]:
    """Supervised warm start, cached in the output folder under a hash of what shapes it."""
    from .sft import warm_start

    base = spec["base"]
    key_src = json.dumps({"ws": spec["warm_start"], "task": base.get("task"), "model": base.get("model")},
                         sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    path = out_dir / f"warmstart-{key}.safetensors"
    info_path = path.with_suffix(".json")
    if path.is_file() and info_path.is_file():
        return path, json.loads(info_path.read_text())
    cfg = config_from_dict({**base, "log": {"out_dir": str(out_dir)}})
    task = get_task(cfg.task.name, **cfg.task.options)
    seed_everything(cfg.train.seed)
    model, tokenizer = build_model(cfg.model, task, __import__("torch").device("cpu"))
    ws = spec["warm_start"]
    t0 = time.perf_counter()
    bar = _bar(ws["steps"], "warm start (supervised)", progress)
    engine = RolloutEngine(model, tokenizer)
    target, every = float(ws.get("target_accuracy", 1.0)), int(ws.get("check_every", 50))
    accuracy: dict = {}

    def reached(step: int, loss: float) -> bool:
        # greedy accuracy on the train split: the test split stays unseen until the RL runs end
        if step % every:
            return False
        accuracy.update(evaluate_policy(model, engine, task, split="train", limit=256,
                                        max_new_tokens=cfg.rollout.max_new_tokens))
        return accuracy["eval/mean@1"] >= target

    losses = warm_start(model, tokenizer, task.sft_examples("train"), steps=ws["steps"],
                        batch_size=ws["batch_size"], lr=float(ws["lr"]), seed=cfg.train.seed,
                        progress=bar.update if bar else None, should_stop=reached)
    if bar:
        bar.close()
    save_weights(model, path)
    info = {"steps": len(losses), "max_steps": ws["steps"], "target_accuracy": target,
            "train_accuracy": accuracy.get("eval/mean@1"), "loss_first": losses[0],
            "loss_final": losses[-1], "wall_s": time.perf_counter() - t0}
    info_path.write_text(json.dumps(info, indent=1))
    return path, info


def run_demo(out_dir: str | Path = "runs/demo", *, quick: bool = False, config: str | None = None,
             progress: bool = True) -> dict:
    from .trainer import Trainer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_demo_spec(config, quick)
    weights, ws_info = warm_start_weights(spec, out, progress)
    summaries, run_dirs = {}, []
    for name, overrides in spec["runs"].items():
        data = _merge(spec["base"], overrides)
        data = _merge(data, {"name": name, "model": {"init_weights": str(weights)},
                             "log": {"out_dir": str(out / name)}})
        cfg = config_from_dict(data)
        seed_everything(cfg.train.seed)
        t0 = time.perf_counter()
        trainer = Trainer(cfg, progress=progress)
        start_eval = trainer.evaluate() if name == next(iter(spec["runs"])) else None
        rows = trainer.fit()
        final_eval = trainer.evaluate()
        wall = time.perf_counter() - t0
        s = summarize(rows)
        s["wall_s"] = wall
        s.update({k.replace("eval/", "eval_final_"): v for k, v in final_eval.items()})
        if start_eval is not None:
            ws_info.update({k.replace("eval/", "eval_"): v for k, v in start_eval.items()})
        summaries[name] = s
        run_dirs.append(out / name)
    report = make_report(run_dirs, out, names=list(summaries))
    summary = {name: _public(name, s) for name, s in summaries.items()}
    summary["warm_start"] = ws_info
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(_summary_md(summary, report, spec, quick))
    return summary


def _public(name: str, s: dict) -> dict:
    keys = SUMMARY_FIELDS + (FP8_FIELDS if name != "bf16" else ())
    out = {k: s.get(k) for k in keys}
    out.update({k: v for k, v in s.items() if k.startswith("eval_") or k == "entropy_surge_steps"})
    return out


def _summary_md(summary: dict, report: dict, spec: dict, quick: bool) -> str:
    b = spec["base"]
    lines = [
        "# fp8rl demo" + (" (quick)" if quick else ""),
        "",
        f"Task: {b['task']['name']} {b['task'].get('options', {})}; tiny Qwen3; "
        f"{b['rollout']['prompts_per_step']} prompts x {b['rollout']['n']} samples per step, "
        f"{b['train']['mini_batches']} mini-batch updates per step, lr {b['train']['lr']}, "
        f"{b['train']['steps']} steps; shadow passes every {b['calibration']['interval']} steps.",
        f"Warm start: {summary['warm_start']}",
        "",
        report["table"],
        "",
        "## What to look at",
        "- `shadow_lower_clipfrac_neg_fp8_mean` vs `shadow_lower_clipfrac_neg_bf16_mean` in the `fp8` run:",
        "  how often FP8 ratios clip negative-advantage tokens at the lower bound, against the same",
        "  weights in high precision. The excess is the paper's failure mode.",
        "- The same pair in `fp8-calibrated`: at each calibration Algorithm 1 sets L so FP8 clips as",
        "  often as BF16 on that step's tokens; the next calibration step shows how well it held.",
        "  `clipfrac_lower_neg_mean` (every step) against the `bf16` run's is the other view.",
        "- `shadow_nmae_prob_mean` and `shadow_amplification_mean`: per-token FP8 noise and how much",
        "  the ratio amplifies it.",
        "- `reward_final` and the eval accuracy of each run, and `entropy_mean`.",
        "",
    ]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


class _bar:
    def __init__(self, total: int, desc: str, enabled: bool):
        self.enabled = enabled
        if enabled:
            from rich.progress import Progress

            self.p = Progress()
            self.t = self.p.add_task(desc, total=total)
            self.p.start()

    def __bool__(self):
        return self.enabled

    def update(self, step: int, loss: float):
        self.p.update(self.t, completed=step, description=f"warm start (supervised) loss {loss:.3f}")

    def close(self):
        self.p.stop()
