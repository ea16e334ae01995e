"""The Trainer: builds the pieces a run needs, then loops `run_step` with checkpoints and logs.

The loop itself is short on purpose: `fit` is the whole story of a run.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

from ..config import RunConfig, keep_precision
from ..config.model_shapes import check_built_model, check_positions
from ..config.model_window import check_window_fits
from ..config.precision import prepare_model, recipe_for
from ..config.validate import check_extras
from ..errors import Fp8rlError, os_errors
from ..rollout import RolloutEngine
from ..step.context import StepContext, build_plan
from ..step.parallel import SingleProcess
from ..step.records import PromptSchedule, Seeds
from ..step.step import run_step
from ..tasks import chat_task, get_task
from ..utils import append_text, atomic_write_text
from . import provenance, run_folder
from .build import (
    build_model,
    build_vllm_engine,
    calibration_state,
    device_of,
    make_optimizer,
    resolve_ratio_noise,
)
from .checkpoint import load_checkpoint, load_weights, save_checkpoint, sha256_file
from .fit_checks import fit_warnings, test_split
from .run_folder import FolderLock
from .runlog import (
    RESPONSES_FILE,
    SAMPLES_FILE,
    EntropySurgeDetector,
    MetricsLog,
    Progress,
    RowsOnlyLog,
    append_jsonl,
    restart_jsonl,
    warn,
)
from .warmstart import start_weights


@dataclasses.dataclass
class _Outputs:
    """What the steps of a fit() or run() in progress write to, and the step it runs to."""

    log: MetricsLog | RowsOnlyLog
    responses: Path | None
    samples: Path | None
    bar: Progress
    until: int


class Trainer:
    # DistributedTrainer: its ranks wait for the one of them that builds a missing warm start
    wait_for_warm_start = False

    def __init__(self, cfg: RunConfig, *, progress: bool | None = None, resuming: bool = False):
        check_extras(cfg)  # first: a missing package is one line before anything is built
        self.cfg = cfg
        self.run_dir = Path(cfg.log.out_dir)  # created by fit, after its checks (run_folder.py)
        self.device = device_of(cfg.model.device)
        self.task = get_task(cfg.task.name, **cfg.task.options)
        self.model, self.tokenizer = build_model(cfg.model, self.task, self.device)
        tc = cfg.task
        self.task = chat_task(
            self.task, self.tokenizer, chat=tc.chat, system_prompt=tc.system_prompt
        )
        self.train_samples = self.task.samples("train")
        # before the warm start (minutes) and the run folder: the model fits the prompts
        every = [*self.train_samples, *test_split(cfg, self.task)]
        check_positions(cfg, every, self.tokenizer, self.model)
        check_window_fits(self.model, self.tokenizer, self.train_samples, cfg)
        # before a warm start is built: architectures validation cannot read (model_shapes.py)
        kept = check_built_model(self.model, cfg)
        keep_precision.check_model(self.model, cfg, self.device)
        self.shape_warnings = [kept] if kept else []  # fit gives them with its own warnings
        # resuming: a checkpoint's weights replace the start weights (the `auto` warm start
        # takes minutes to build), and fit(resume=True) refuses a folder without one
        start = None
        if not resuming:
            start = start_weights(
                cfg,
                progress=cfg.log.progress if progress is None else progress,
                wait=self.wait_for_warm_start,
            )
        # events.log lines fit writes once the folder is checked
        self.startup_events = [f"warning: {text}" for text in self.shape_warnings]
        if start is not None:
            load_weights(self.model, start)
            # the weights a run started from, by content: runs paired across machines can
            # then be told apart from runs that only share a cache key
            self.startup_events.append(f"start weights {start}: sha256 {sha256_file(start)}")
        self.conversion = prepare_model(
            self.model,
            cfg.rollout.precision,
            cfg.train.precision,
            cfg.model.keep_high_precision.policy(),
        )
        self.rollout_recipe = recipe_for(cfg.rollout.precision, cfg.train.fp8_check_finite)
        self.train_recipe = recipe_for(cfg.train.precision, cfg.train.fp8_check_finite)
        # evaluation reads the current weights through fp8rl's engine (it shares them), so
        # it never waits for, or causes, a push into a vLLM rollout engine
        self.eval_engine = RolloutEngine(
            self.model, self.tokenizer, recipe=self.rollout_recipe, kv_cache=cfg.rollout.kv_cache
        )
        self.engine = self.eval_engine
        if cfg.rollout.engine == "vllm":
            self.engine = build_vllm_engine(cfg, self.model, self.tokenizer, self.rollout_recipe)
            self.startup_events.append(self.engine.describe())
        self.optimizer = make_optimizer(self.model, cfg)
        self.calibration = calibration_state(cfg)
        self.surge = EntropySurgeDetector(
            factor=cfg.calibration.entropy_surge_factor, window=cfg.calibration.entropy_surge_window
        )
        self.skipped_updates = 0
        self.step = 0
        self.show_progress = cfg.log.progress if progress is None else progress
        self.dp = SingleProcess()  # DistributedTrainer swaps in torch.distributed collectives
        # >1: each of these contiguous shares of the groups samples with its own generator,
        # as the ranks of a data-parallel run do (one process can then reproduce N ranks)
        self.rollout_shards = 1
        self.fitted = False  # fit() ran: its folder checks passed and the folder holds this run
        self._outputs: _Outputs | None = None  # set while a fit() or run() is stepping
        self.noise = resolve_ratio_noise(cfg)
        if self.noise is not None:
            self.startup_events.append(
                f"loss.ratio_noise: sd {self.noise[0]:.6g}, corr {self.noise[1]:.6g} per pass"
            )
        # every per-run decision of the step, resolved once; a probe (diagnose) replaces it
        self.plan = build_plan(cfg, self.noise)

    def context(self) -> StepContext:
        """What run_step reads; built from the current members (a subclass may replace dp,
        the optimizer or rollout_shards after __init__)."""
        dp = self.dp
        return StepContext(
            plan=self.plan,
            model=self.model,
            engine=self.engine,
            task=self.task,
            optimizer=self.optimizer,
            train_recipe=self.train_recipe,
            dp=dp,
            calibration=self.calibration,
            seeds=Seeds(
                self.cfg.train.seed, self.device, self.rollout_shards, dp.rank, dp.world_size
            ),
            prompts=PromptSchedule(
                self.train_samples, self.cfg.rollout.prompts_per_step, self.cfg.train.seed
            ),
            log_event=self.log_event,
            device=self.device,
        )

    @os_errors("append to the events log")
    def log_event(self, text: str) -> None:
        if not self.dp.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)  # also outside fit (run_step alone)
        append_text(self.run_dir / "events.log", f"step {self.step}: {text}\n")

    # ---------------------------------------------------------------- checkpoints

    def state(self) -> dict:
        return {
            "calibration": self.calibration.state_dict(),
            "entropy_surge": self.surge.state_dict(),
            "skipped_updates": self.skipped_updates,
            "config": self.cfg.to_dict(),
        }

    def state_tensors(self) -> dict:
        return {"calibration_pool": self.calibration.pool_tensors()}

    def save(self) -> Path | None:
        if not self.dp.is_main:  # replicated weights: one writer
            return None
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.optimizer,
            self.state(),
            keep_last=self.cfg.log.keep_last,
            tensors=self.state_tensors(),
        )

    def resume(self, plan: run_folder.Plan | None = None) -> bool:
        """Continue from the newest intact checkpoint (newer corrupt ones move aside); False
        when there is none. `plan`: what run_folder.check found (fit passes it)."""
        if plan is None:
            plan = run_folder.check(self.cfg, resume=True, overwrite=False)
            if self.dp.is_main:
                run_folder.apply(plan)
        if plan.checkpoint is None:
            return False
        self.restore_state(self.load_checkpoint(plan.checkpoint, plan.state))
        return True

    def load_checkpoint(self, path: Path, state: dict) -> dict:
        return load_checkpoint(path, self.model, self.optimizer, state=state)

    def restore_state(self, state: dict) -> None:
        """The non-tensor state of a checkpoint (see `state`)."""
        self.step = int(state["step"])
        self.calibration.load_state_dict(state["calibration"])
        self.calibration.load_pool_tensors(
            state.get("tensors", {}).get("calibration_pool", {}), device=self.device
        )
        self.surge.load_state_dict(state["entropy_surge"])
        self.skipped_updates = int(state["skipped_updates"])

    # ---------------------------------------------------------------- the loop

    def lock_run_folder(self, what: str = "fp8rl train") -> FolderLock | None:
        """Rank 0 locks the run folder (run_folder.acquire); every rank learns whether it could, so
        none waits at a collective for a rank that stopped. Release the lock returned."""
        lock, error = None, None
        if self.dp.is_main:
            try:
                lock = run_folder.acquire(self.run_dir, what)
            except Fp8rlError as e:
                error = e
        if self.dp.sum_int(int(error is not None)):
            raise error or Fp8rlError(f"rank 0 could not lock the run folder {self.run_dir}")
        return lock

    def fit(self, *, resume: bool = False, overwrite: bool = False) -> list[dict]:
        """Train to cfg.train.steps. A run folder that holds metrics or checkpoints needs
        `resume` (continue) or `overwrite` (move its contents to RUN/.old-<time>/); both are
        checked before anything is written (run_folder.py), under the folder's lock: another
        process in the folder is an error naming its pid."""
        return self._run(None, resume=resume, overwrite=overwrite)

    def run(self, steps: int) -> list[dict]:
        """Train `steps` more steps past `self.step` and return their rows: a caller that stops
        between steps (a benchmark's time budget) changes no config. The first call checks and
        arranges the run folder as fit() does; a later run() or fit() continues the same run."""
        return self._run(self.step + steps, resume=False, overwrite=False)

    def train_step(self) -> dict:
        """One step, as fit's loop makes it: `run_step` (rollout to optimizer step), then the
        trainer's share (entropy surge, eval, the metrics row, a checkpoint when due). Returns
        the step's row. Outside a fit() or run() it is run(1)."""
        out = self._outputs
        if out is None:
            return self.run(1)[0]
        t0 = time.perf_counter()
        result = run_step(self.context(), self.step)
        self.skipped_updates += result.skipped_updates
        metrics = result.metrics
        if result.responses and out.responses is not None:
            append_jsonl(out.responses, result.responses)
        if result.samples and out.samples is not None:
            append_jsonl(out.samples, result.samples)
        self._watch_entropy(metrics)
        metrics["train/skipped_updates_total"] = float(self.skipped_updates)
        if self.cfg.log.eval_every and (self.step + 1) % self.cfg.log.eval_every == 0:
            metrics.update(self.evaluate())
        metrics["time/wall_step"] = time.perf_counter() - t0
        row = out.log.write(self.step, metrics)
        out.bar.update(row)
        self.step += 1
        every = self.cfg.log.checkpoint_every
        if every and (self.step % every == 0 or self.step == out.until):
            self.save()
        return row

    def _watch_entropy(self, metrics: dict) -> None:
        surge = self.surge.update(self.step, float(metrics["rollout/entropy"]))
        metrics["rollout/entropy_surge"] = float(surge)
        if surge:
            self.log_event(
                f"entropy surge: {float(metrics['rollout/entropy']):.4f} is over "
                f"{self.surge.factor}x the trailing median"
            )

    def _run(self, until: int | None, *, resume: bool, overwrite: bool) -> list[dict]:
        """The loop of fit() and run(): to step `until` (None: cfg.train.steps, read after a
        resume has set self.step), under the run folder's lock."""
        lock = self.lock_run_folder("fp8rl train --resume" if resume else "fp8rl train")
        try:
            resumed = self._open_folder(resume=resume, overwrite=overwrite)
            until = self.cfg.train.steps if until is None else until
            self._outputs = self._open_outputs(resumed, until)
            rows = []
            try:
                while self.step < until:
                    rows.append(self.train_step())
            finally:
                out, self._outputs = self._outputs, None
                out.bar.close()
                out.log.close()
            return rows
        finally:
            if lock is not None:
                lock.release()

    def _open_folder(self, *, resume: bool, overwrite: bool) -> bool:
        """The run folder checked and arranged (the first time only), config.json written;
        whether the run continues earlier steps (so the logs append)."""
        main = self.dp.is_main  # data parallel: only rank 0 writes files and shows progress
        first = not self.fitted  # a later fit() or run() of this process continues its run
        if self.fitted:  # a later fit() of this same run in this process: the folder is its own
            resumed = True
        else:
            # before the folder checks: a config that cannot run on this task touches nothing
            warnings = fit_warnings(self.cfg, self.task, self.train_samples)
            for text in [*self.shape_warnings, *warnings]:
                if main:
                    warn(text)
            plan = run_folder.check(self.cfg, resume=resume, overwrite=overwrite)
            self.dp.barrier()  # every rank has read the folder before rank 0 moves anything ...
            if main:
                run_folder.apply(plan)
            self.dp.barrier()  # ... and none writes to it before rank 0 has arranged it
            for text in self.startup_events:
                self.log_event(text)
            resumed = self.resume(plan) if resume else False
            if resumed:  # what a reader of the run's history needs to know first
                self.log_event(f"resumed from {plan.checkpoint.name}")
        self.fitted = True
        with os_errors("write"):
            if main:
                # rewritten on resume: a kill mid-write must not leave the folder without it
                atomic_write_text(
                    self.run_dir / "config.json", json.dumps(self.cfg.to_dict(), indent=1)
                )
                if first:
                    weights = provenance.start_weights(self.cfg.model)
                    provenance.record(self.run_dir, self.step if resumed else 0, weights)
            if self.conversion is not None and main:
                atomic_write_text(self.run_dir / "fp8_conversion.txt", str(self.conversion))
        return resumed

    def _open_outputs(self, resumed: bool, until: int) -> _Outputs:
        main = self.dp.is_main
        log = (
            MetricsLog(
                self.run_dir,
                resume_step=self.step if resumed else None,
                tensorboard=self.cfg.log.tensorboard,
                config=self.cfg.to_dict(),
            )
            if main
            else RowsOnlyLog()
        )
        responses = None
        if self.cfg.log.response_stats and main:
            responses = restart_jsonl(self.run_dir, RESPONSES_FILE, self.step if resumed else None)
        samples = None
        if self.cfg.log.samples and main:
            samples = restart_jsonl(self.run_dir, SAMPLES_FILE, self.step if resumed else None)
        bar = Progress(until, self.step, self.cfg.name, enabled=self.show_progress and main)
        return _Outputs(log, responses, samples, bar, until)

    def evaluate(self, split: str = "test") -> dict:
        from .evaluate import evaluate_policy

        return evaluate_policy(
            self.model,
            self.eval_engine,
            self.task,
            split=split,
            limit=self.cfg.log.eval_size,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            seed=self.cfg.train.seed,
        )


def install_sigterm_handler() -> None:
    """Turn SIGTERM into SystemExit so `finally` blocks flush logs; checkpoints are atomic
    anyway."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
