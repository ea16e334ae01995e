"""What a valid config can still get wrong for its task: a run that cannot start is refused,
one that runs but cannot learn (or keeps less than the user expects) gets a warning.

Checked by `Trainer.fit` before the run folder is touched; warnings are one line on stderr
each (runlog.warn), never errors, so a dry run or a smoke test stays possible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..rl.calibration import RULES
from ..rl.loss_modes import RatioLevel

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..tasks import Task


def fit_warnings(cfg: RunConfig, task: Task, train: Sequence) -> list[str]:
    """The warnings of this config on this task (`train`: its train samples); raises
    ConfigError when the run cannot start."""
    if not train and cfg.train.steps > 0:
        # the prompt schedule would divide by zero at the first step
        raise ConfigError(
            "task.options",
            cfg.task.options,
            f"a task with train problems (task {task.name!r} "
            "has none; train.steps=0 for a run without training)",
        )
    out = _learning_warnings(cfg)
    rc, log = cfg.rollout, cfg.log
    if train and rc.prompts_per_step > len(train):
        out.append(
            f"rollout.prompts_per_step = {rc.prompts_per_step} is more than the task's "
            f"{len(train)} train problems: each step repeats problems"
        )
    test = test_split(cfg, task)
    if log.eval_size > len(test):
        out.append(
            f"log.eval_size = {log.eval_size} is more than the task's {len(test)} test "
            f"problems: the evaluation uses {len(test) or 'none'}"
        )
    need = getattr(task, "max_new_tokens", None)  # the tasks that know their longest response
    if isinstance(need, int) and rc.max_new_tokens < need:
        out.append(
            f"rollout.max_new_tokens = {rc.max_new_tokens} is below the {need} tokens the "
            f"task's longest reference response and its <eos> take: such responses are cut off"
        )
    return out


def test_split(cfg: RunConfig, task: Task) -> Sequence:
    """The test samples the run evaluates on; none read when it evaluates nothing. A task
    without a test split is refused here, not after training, when the evaluation runs."""
    if not cfg.log.eval_size:
        return ()
    try:
        return task.samples("test")
    except ConfigError as e:
        raise ConfigError(
            f"task.options.{e.key}",
            e.value,
            f"{e.allowed} (log.eval_size > 0 evaluates on the test split; 0 for none)",
        ) from None


def _learning_warnings(cfg: RunConfig) -> list[str]:
    out = []
    steps = cfg.train.steps
    if cfg.rollout.n == 1:
        out.append(
            "rollout.n = 1: a group of one sample has advantage 0, so no update moves the "
            "weights (n >= 2 to learn)"
        )
    every = cfg.log.checkpoint_every
    if steps > 0 and every > steps:
        out.append(
            f"log.checkpoint_every = {every} is more than train.steps = {steps}: only the "
            "last step is checkpointed, a crash before it leaves nothing to resume"
        )
    if steps > 0 and cfg.log.eval_every > steps:
        out.append(
            f"log.eval_every = {cfg.log.eval_every} is more than train.steps = {steps}: "
            "no evaluation during the run"
        )
    if cfg.loss.table.moves_bounds and steps > 0:
        out += _refit_warnings(cfg)
    return out


def _refit_warnings(cfg: RunConfig) -> list[str]:
    """A calibrated run whose bounds can never move: it clips as ppo_clip does."""
    cc, rc, steps = cfg.calibration, cfg.rollout, cfg.train.steps
    rule = RULES[cc.rule]
    first_refit = rule.first_refit_step(cc.interval)  # CalibrationState.is_refit_step
    if first_refit >= steps:
        return [
            f"calibration.interval = {cc.interval} with train.steps = {steps}: the bounds are "
            "never refit (the run clips at the nominal bounds, as ppo_clip)"
        ]
    # a refit sees at most the response tokens (GSPO: the responses) of its pooled shadow steps
    pooled = cc.pool_window if rule.pools else 1
    sequences = cfg.loss.table.level is RatioLevel.SEQUENCE
    most = pooled * rc.prompts_per_step * rc.n * (1 if sequences else rc.max_new_tokens)
    if cc.min_tokens > most:
        what = "responses" if sequences else "response tokens"
        return [
            f"calibration.min_tokens = {cc.min_tokens} is more than the {most} {what} "
            "a refit can see: the bounds are never refit"
        ]
    return []


def all_updates_skipped(rows: list[dict]) -> str | None:
    """The error of a run whose every optimizer update was skipped (a non-finite loss or
    gradient each time): its weights never moved, so its exit must not say it trained."""
    updates = sum(r.get("train/updates") or 0 for r in rows)
    skipped = sum(r.get("train/skipped_updates") or 0 for r in rows)
    if not updates or skipped < updates:
        return None
    return (
        f"every one of the run's {int(updates)} updates was skipped for a non-finite loss or "
        "gradient: the weights never changed (train/skipped_updates in metrics.jsonl, "
        "events.log)"
    )
