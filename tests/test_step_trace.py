"""How much a reader must open to follow one calibrated step: a call tracer over `run_step` at
a step that is both a shadow step and a refit step (the longest path a step takes) lists the
fp8rl source files the step's own code enters (docs/architecture.md, "Reading one step",
gives them in reading order).

"The step's own code" is step/ and rl/: a file counts when a function of step/ or rl/ calls
into it (or it is step/step.py itself). A reader follows those calls; what the rollout engine,
the tasks and the FP8 layer call below their entry points is theirs to read, not the step's."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import fp8rl
from fp8rl.step.step import run_step
from fp8rl.step.update import micro_slices
from fp8rl.utils import host_list
from helpers_step import parity_reward, step_context

MAX_FILES = 20
# every file entered, below the entry points too (the rollout engine's decode loop, the FP8
# layer's quantizers): today's count, so a step that starts to wander further fails here
MAX_ENTERED = 37
PACKAGE = Path(fp8rl.__file__).resolve().parent
STEP_CODE = ("step/", "rl/")


def _in_package(code) -> str | None:
    path = Path(code.co_filename)
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None


def entered_files(fn, *args) -> tuple[list[str], list[str], object]:
    """(the fp8rl files the step's own code calls into, every fp8rl file entered), each in
    the order first entered, and what `fn(*args)` returned."""
    read: dict[str, None] = {}
    every: dict[str, None] = {}

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = _in_package(frame.f_code)
        if callee is None:
            return
        every.setdefault(callee)
        caller = _in_package(frame.f_back.f_code) if frame.f_back is not None else None
        if frame.f_code is fn.__code__ or (caller or "").startswith(STEP_CODE):
            read.setdefault(callee)

    sys.setprofile(profile)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return list(read), list(every), out


def test_the_tracer_counts_what_the_step_code_calls_and_not_below():
    def from_a_test():
        return host_list(torch.tensor([1]))  # called from this file, not from step/ or rl/

    assert entered_files(from_a_test)[:2] == ([], ["utils.py"])
    assert entered_files(micro_slices, 5, 2)[:2] == (["step/update.py"], ["step/update.py"])
    assert entered_files(lambda: Path("x").name)[:2] == ([], [])


def test_one_calibrated_shadow_and_refit_step_reads_at_most_20_files():
    calibration = {"interval": 1, "shadow_every": 1, "min_tokens": 2}
    ctx = parity_reward(step_context(loss={"mode": "calibrated"}, calibration=calibration))
    run_step(ctx, 0)  # step 0 only shadows (the pooled rule refits from step 1): a warm-up
    assert ctx.calibration.is_shadow_step(1) and ctx.calibration.is_refit_step(1)
    read, every, result = entered_files(run_step, ctx, 1)
    assert "calib/next_lower" in result.metrics  # the refit ran
    assert result.shadow is not None  # and the shadow phase
    assert {"step/step.py", "rl/shadow.py", "rl/calibration.py"} <= set(read) <= set(every)
    assert len(read) <= MAX_FILES, (
        f"one step reads {len(read)} files (at most {MAX_FILES}), in order:\n"
        + "\n".join(read)
        + f"\n(every fp8rl file entered: {len(every)})"
    )
    assert len(every) <= MAX_ENTERED, "\n".join(every)
