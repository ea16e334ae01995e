"""One RL step without a Trainer: `step_context` builds the `StepContext` that `run_step` reads
from its pieces (a tiny model from a transformers config, the task, fp8rl's rollout engine, the
optimizer, the calibration state and the plan `build_plan` resolves), and `parity_reward`
gives a random model's groups mixed rewards. No run folder, checkpoint or log is written:
events go to a list.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import torch

from helpers_config import tiny_config


def parity_reward(holder):
    """A random tiny model never answers right; a reward on the text's parity gives every
    group mixed rewards, so advantages (and gradients) are non-zero. `holder`: a Trainer or
    a StepContext (anything with a `task`)."""
    from fp8rl.tasks import RewardResult

    holder.task.reward = lambda text, sample: RewardResult(
        float(sum(map(ord, text)) % 2), {"parsed": True}
    )
    return holder


def step_context(*, dp=None, **sections):
    """The StepContext of the tiny run (helpers_config.tiny_config, `sections` update it) built
    from its pieces as a run builds them before its first step, with no Trainer, no run folder
    and no warm start. The model is tiny_config's tiny transformers model with the task's own
    tokenizer (tasks without one need a checkpoint: not built here). `dp`: the data-parallel
    seam (SingleProcess by default). Its log events are appended to `ctx.log_event.__self__`.

    The optimizer, the calibration state and loss.ratio_noise come from train/build.py, the
    one place that turns those config sections into objects."""
    from fp8rl.config import config_from_dict
    from fp8rl.config.precision import prepare_model, recipe_for
    from fp8rl.models import tiny_model
    from fp8rl.rollout import RolloutEngine
    from fp8rl.step.context import StepContext, build_plan
    from fp8rl.step.parallel import SingleProcess
    from fp8rl.step.records import PromptSchedule, Seeds
    from fp8rl.tasks import chat_task, get_task
    from fp8rl.train.build import calibration_state, device_of, make_optimizer, resolve_ratio_noise

    cfg = config_from_dict(tiny_config("unused-run-folder", **sections))
    device = device_of(cfg.model.device)
    task = get_task(cfg.task.name, **cfg.task.options)
    tok = task.tokenizer
    dtype = getattr(torch, cfg.model.dtype)
    model = tiny_model(vocab_size=len(tok), dtype=dtype, **cfg.model.tiny)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tok, name, None)
        if value is not None:
            setattr(model.config, name, value)
            setattr(model.generation_config, name, value)
    model = model.to(device)
    task = chat_task(task, tok, chat=cfg.task.chat, system_prompt=cfg.task.system_prompt)
    rc, tc = cfg.rollout, cfg.train
    prepare_model(model, rc.precision, tc.precision, cfg.model.keep_high_precision.policy())
    rollout_recipe = recipe_for(rc.precision, tc.fp8_check_finite)
    dp = dp or SingleProcess()
    events: list[str] = []
    return StepContext(
        plan=build_plan(cfg, resolve_ratio_noise(cfg)),
        model=model,
        engine=RolloutEngine(model, tok, recipe=rollout_recipe, kv_cache=rc.kv_cache),
        task=task,
        optimizer=make_optimizer(model, cfg),
        train_recipe=recipe_for(tc.precision, tc.fp8_check_finite),
        dp=dp,
        calibration=calibration_state(cfg),
        seeds=Seeds(tc.seed, device, 1, dp.rank, dp.world_size),
        prompts=PromptSchedule(task.samples("train"), rc.prompts_per_step, tc.seed),
        log_event=events.append,
        device=device,
    )


def step_rows(ctx, steps: int = 1) -> list[dict]:
    """The metrics rows of `run_step` on steps 0 .. steps-1 of `ctx`, as floats."""
    from fp8rl.step.step import run_step

    return [{k: float(v) for k, v in run_step(ctx, s).metrics.items()} for s in range(steps)]
