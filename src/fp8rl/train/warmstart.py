"""Supervised warm starts, cached: `model.warm_start: auto` (and `fp8rl warmstart`).

RL from random weights earns no reward on a verifiable task: every group scores 0 and no
advantage is non-zero. A warm start is a short supervised run on the task's own solutions
(`warm_start`: teacher-forced cross-entropy on (prompt, target) pairs) until greedy train
accuracy reaches `warm_start.target_accuracy` or, when `warm_start.target_entropy` is set, the
sampling entropy at temperature 1 falls to it (a start that still samples diverse responses,
for the long-horizon study). It is cached
under $FP8RL_CACHE (default ~/.cache/fp8rl)/warmstart/, keyed by a hash of the task, the
model and the warm-start settings, so every run and every sweep worker with the same key
loads the same weights and only the first one trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import RunConfig
from ..errors import CheckpointError, ConfigError
from ..rollout import RolloutEngine
from ..tasks import encode_pairs, get_task
from ..utils import atomic_write_text, seed_everything
from .build import build_model
from .checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_weights,
    sha256_file,
)
from .evaluate import evaluate_policy, sampled_entropy
from .run_folder import held
from .runlog import CounterBar, warn

MODES = ("none", "auto")  # or a path to a safetensors file


def cache_dir() -> Path:
    if not (os.environ.get("FP8RL_CACHE") or os.environ.get("HOME")):
        # Path.home() of an empty HOME is the filesystem root
        raise ConfigError("FP8RL_CACHE", "", "a folder for the warm-start cache (or set HOME)")
    return Path(os.environ.get("FP8RL_CACHE") or Path.home() / ".cache" / "fp8rl")


def warm_start_key(cfg: RunConfig) -> str:
    """What shapes the warm start: the task, the model, its settings (its seed included) and
    the answer length its accuracy check decodes."""
    m = cfg.model
    settings = dataclasses.asdict(cfg.warm_start)
    if settings["target_entropy"] is None:
        del settings["target_entropy"]  # the keys of warm starts from before it stay valid
    task = dataclasses.asdict(cfg.task)
    for key, default in (("chat", None), ("system_prompt", "default")):
        if task[key] == default:  # as target_entropy: keys from before chat prompts stay valid
            del task[key]
    src = json.dumps(
        {
            "warm_start": settings,
            "task": task,
            "model": {"source": m.source, "tiny": m.tiny, "dtype": m.dtype},
            "max_new_tokens": cfg.rollout.max_new_tokens,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def cached_path(cfg: RunConfig) -> Path:
    return cache_dir() / "warmstart" / f"{warm_start_key(cfg)}.safetensors"


def start_weights(cfg: RunConfig, progress: bool = False, wait: bool = False) -> Path | None:
    """The file a run starts from: model.init_weights (an explicit file wins), else the
    warm start model.warm_start names (`auto`: the cached one, built if missing; `wait`: for
    a builder of it that is running, as data-parallel ranks do, rather than refuse)."""
    if cfg.model.init_weights:
        return Path(cfg.model.init_weights)
    mode = cfg.model.warm_start
    if mode == "none":
        return None
    if mode == "auto":
        return ensure_warm_start(cfg, progress=progress, wait=wait)[0]
    return Path(mode)


def ensure_warm_start(
    cfg: RunConfig, *, progress: bool = False, wait: bool = False
) -> tuple[Path, dict]:
    """(weights file, info) of the cached warm start for `cfg`, built on the CPU if missing.

    Both files are written to a temporary name and renamed, the info last, with the sha256
    of the weights: an entry is used only when that hash matches (`_intact_info`)."""
    path = cached_path(cfg)
    info_path = path.with_suffix(".json")
    info = _intact_info(path, info_path)
    if info is not None:
        return path, info
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            "FP8RL_CACHE", str(cache_dir()), f"a writable folder ({e.strerror})"
        ) from e
    # one builder per key: a second is refused naming the first's pid (run_folder.acquire)
    lock = f".{path.stem}.lock"
    with held(path.parent, "the warm-start builder", name=lock, wait=wait):
        # a bad entry's info was removed above: an info now is one built in the meantime
        info = _intact_info(path, info_path) if info_path.is_file() else None
        if info is None:
            info = _build_into(cfg, path, info_path, progress)
    return path, info


def _build_into(cfg: RunConfig, path: Path, info_path: Path, progress: bool) -> dict:
    partial = path.with_name(f".{path.stem}.partial")  # the build's own checkpoints
    model, info = build_warm_start(cfg, progress=progress, partial=partial)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_weights(model, tmp)
    os.replace(tmp, path)
    info = {**info, "key": warm_start_key(cfg), "sha256": sha256_file(path)}
    atomic_write_text(info_path, json.dumps(info, indent=1))
    shutil.rmtree(partial, ignore_errors=True)
    return info


class _Partial:
    """A build's own checkpoints (CACHE/warmstart/.KEY.partial/, one kept, every check_every
    steps): a build killed after minutes continues from the newest intact one, to the same
    weights as one never killed (model, AdamW, schedule, sampler and the checks' state)."""

    def __init__(self, folder: Path, model, checked: dict, every: int):
        self.folder, self.model, self.checked, self.every = folder, model, checked, every

    def resume(self, opt, sched, gen) -> list[float]:
        ckpt = latest_checkpoint(self.folder)
        if ckpt is None:
            return []
        try:
            state = load_checkpoint(ckpt, self.model, opt)
        except CheckpointError as e:  # verified before anything is loaded: start over
            warn(f"warm start: {e}; building from step 0")
            return []
        sched.load_state_dict(state["sched"])
        gen.set_state(state["tensors"]["generator"]["state"])
        self.checked.update(state["checked"])
        warn(f"warm start: continuing the build killed after step {state['step']} ({ckpt})")
        return list(state["losses"])

    def save(self, opt, sched, gen, losses: list[float]) -> None:
        state = {"losses": losses, "sched": sched.state_dict(), "checked": self.checked}
        tensors = {"generator": {"state": gen.get_state()}}
        save_checkpoint(self.folder, len(losses), self.model, opt, state, 1, tensors)


def _intact_info(path: Path, info_path: Path) -> dict | None:
    """The info of a cache entry whose weights match the sha256 it records. An entry cut
    short, missing a file, changed, unreadable or from before entries carried a hash gives
    None after a one-line notice, its info removed (a cache: rebuilding it is the repair,
    and the rebuild's rename replaces the weights)."""
    if not path.exists() and not info_path.exists():
        return None  # never built
    try:
        info = json.loads(info_path.read_text())
        recorded = info.get("sha256") if isinstance(info, dict) else None
        if not isinstance(recorded, str):
            problem = f"{info_path} records no sha256 of the weights"
        elif not path.is_file():
            problem = f"{path} is missing"
        elif sha256_file(path) != recorded:
            problem = f"{path} differs from the sha256 its info records (cut short or changed)"
        else:
            return info
    except FileNotFoundError:
        problem = f"{info_path} is missing (a build was interrupted)"
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = f"{info_path} is unreadable ({' '.join(str(e).split())})"
    warn(f"warm-start cache: {problem}; rebuilding it")
    with contextlib.suppress(FileNotFoundError):
        info_path.unlink()
    return None


def _stop_rule(cfg: RunConfig, model, engine, task, checked: dict):
    """should_stop(step, loss) for warm_start: every check_every steps, greedy accuracy
    and (with a target_entropy) the sampling entropy on the train split, recorded in
    `checked`; True once either target is met."""
    ws, tokens = cfg.warm_start, cfg.rollout.max_new_tokens

    def reached(step: int, loss: float) -> bool:
        # the train split: the test split stays unseen until the RL runs end
        if step % ws.check_every:
            return False
        checked.update(
            evaluate_policy(model, engine, task, split="train", limit=256, max_new_tokens=tokens)
        )
        if checked["eval/mean@1"] >= ws.target_accuracy:
            checked["stopped_by"] = "target_accuracy"
            return True
        if ws.target_entropy is None:
            return False
        sampled = sampled_entropy(
            model, engine, task, split="train", limit=256, max_new_tokens=tokens, seed=ws.seed
        )
        checked["entropy"] = sampled["entropy"]
        if sampled["entropy"] <= ws.target_entropy:
            checked["stopped_by"] = "target_entropy"
            return True
        return False

    return reached


def build_warm_start(
    cfg: RunConfig, *, progress: bool = False, partial: Path | None = None
) -> tuple[torch.nn.Module, dict]:
    """Supervised training of a fresh model on the task's train split (on the CPU, seeded by
    warm_start.seed), stopping once greedy train accuracy reaches the target (or the sampling
    entropy its target); the info records the train split's values at the stop and the test
    split's greedy accuracy and sampling entropy (where RL runs are evaluated)."""
    ws = cfg.warm_start
    task = get_task(cfg.task.name, **cfg.task.options)
    if not hasattr(task, "sft_examples"):
        raise ConfigError(
            "model.warm_start", "auto", f"a task with solutions ('{cfg.task.name}' has none)"
        )
    seed_everything(ws.seed)
    model, tokenizer = build_model(cfg.model, task, torch.device("cpu"))
    engine = RolloutEngine(model, tokenizer)
    checked: dict = {}
    t0 = time.perf_counter()
    bar = CounterBar(ws.steps, "warm start", enabled=progress, bar_width=24)

    def show(step: int, loss: float) -> None:
        bar.update(completed=step, description=f"warm start, loss {loss:.3f}")

    losses = warm_start(
        model,
        tokenizer,
        task.sft_examples("train"),
        steps=ws.steps,
        batch_size=ws.batch_size,
        lr=ws.lr,
        seed=ws.seed,
        progress=show if bar else None,
        should_stop=_stop_rule(cfg, model, engine, task, checked),
        saved=None if partial is None else _Partial(partial, model, checked, ws.check_every),
    )
    # stopping early at the target accuracy is done: show 100 %
    bar.update(completed=ws.steps, description=f"warm start done ({len(losses)} steps)")
    bar.close()
    wall = time.perf_counter() - t0
    # log.eval_size 0 (a run that evaluates nothing): its warm start is still measured, on
    # the whole test split, as it always was (the cached infos hold those numbers)
    limit = cfg.log.eval_size or None
    test = dict(split="test", limit=limit, max_new_tokens=cfg.rollout.max_new_tokens)
    greedy = evaluate_policy(model, engine, task, seed=ws.seed, **test)
    sampled = sampled_entropy(model, engine, task, seed=ws.seed, **test)
    info = {
        "steps": len(losses),
        "max_steps": ws.steps,
        "stopped_by": checked.get("stopped_by", "steps"),
        "target_accuracy": ws.target_accuracy,
        "target_entropy": ws.target_entropy,
        "train_accuracy": checked.get("eval/mean@1"),
        "train_entropy": checked.get("entropy"),
        "loss_first": losses[0],
        "loss_final": losses[-1],
        "wall_s": wall,
        **{k.replace("eval/", "eval_"): v for k, v in greedy.items()},
        **{f"eval_sampled_{k}": v for k, v in sampled.items()},
    }
    return model, info


# ---------------------------------------------------------------- the supervised run


def warm_start(
    model,
    tokenizer,
    pairs,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    progress=None,
    should_stop=None,
    saved=None,
) -> list[float]:
    """AdamW with a short warmup and cosine decay over `steps`; returns the loss curve.

    `should_stop(step, loss) -> bool`, when given, ends the warm start early (the demo stops
    once a target accuracy is reached, so RL starts with room to improve). `saved`, when
    given, keeps the build across a kill: `saved.resume(opt, sched, gen)` loads what an
    earlier build left and returns its loss curve, `saved.save(opt, sched, gen, losses)`
    runs after every `saved.every` steps."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
        ),
    )
    model.train()
    losses = saved.resume(opt, sched, gen) if saved is not None else []
    for _ in range(len(losses), steps):
        idx = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        ids, att, lab = encode_pairs(tokenizer, [pairs[i] for i in idx], device)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), lab[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(len(losses), losses[-1])
        if should_stop is not None and should_stop(len(losses), losses[-1]):
            break
        if saved is not None and len(losses) % saved.every == 0 and len(losses) < steps:
            saved.save(opt, sched, gen, losses)
    return losses
