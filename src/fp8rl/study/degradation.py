"""The degradation rule of the long-horizon study (issue 21): did an arm's run go wrong?

A pure function of per-step trajectories, so that the rule is fixed before any run is judged
and a reader can recompute it from the logged metrics. `degradation(arm, reference)` reads
the arm's per-step `entropy` (rollout/entropy), `reward` (rollout/reward) and
`malformed_frac` (rollout/malformed_frac), and the bf16 reference's `entropy` (one run, or
several seeds whose per-step min..max is the band). Steps are 0-based positions in the
trajectories (the logged step when a run logs every step from 0). Each criterion fires at
the step where its condition is first complete, in either direction:

- "entropy_surge": entropy above BAND_FACTOR (2) times the band's top for BAND_STEPS (10)
  consecutive steps; fires at the 10th;
- "entropy_collapse": entropy below the band's bottom divided by BAND_FACTOR (2) for
  BAND_STEPS (10) consecutive steps; fires at the 10th;
- "surge_detector": the EntropySurgeDetector of the run (factor 1.5 over the median of the
  previous 20 steps, after 5 steps of history) flags SURGE_STEPS (3) consecutive steps;
  fires at the 3rd. It needs no reference, so it also judges the bf16 arm itself;
- "reward_drop": the reward's trailing mean over SMOOTH (10) steps (defined from step 9)
  more than REWARD_DROP (0.1) below its running best for REWARD_WINDOW (20) consecutive
  steps; fires at the 20th. The mean keeps batch noise (about 0.06 per step at 64
  responses) from making a lucky step the best;
- "garble": the malformed_frac's trailing mean over SMOOTH (10) steps above GARBLE_LEVEL
  (0.2); fires at the first such step.

The band criteria compare the steps both runs have; without a reference they are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..train.runlog import EntropySurgeDetector

BAND_FACTOR = 2.0
BAND_STEPS = 10
SURGE_STEPS = 3
SMOOTH = 10
REWARD_DROP = 0.1
REWARD_WINDOW = 20
GARBLE_LEVEL = 0.2
CRITERIA = ("entropy_surge", "entropy_collapse", "surge_detector", "reward_drop", "garble")


@dataclass(frozen=True)
class Degradation:
    fired: dict[str, int] = field(default_factory=dict)  # criterion -> step it fired at

    @property
    def degraded(self) -> bool:
        return bool(self.fired)

    @property
    def first_step(self) -> int | None:
        return min(self.fired.values()) if self.fired else None


def _floats(traj: Mapping[str, Sequence[float]], key: str, who: str) -> list[float]:
    if key not in traj:
        raise ValueError(f"degradation: {who} has no {key!r} trajectory (keys {sorted(traj)})")
    return [float(v) for v in traj[key]]


def _run_end(flags: Sequence[bool], length: int) -> int | None:
    """The first step that completes `length` consecutive True flags, else None."""
    run = 0
    for step, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run == length:
            return step
    return None


def _trailing_means(x: Sequence[float], window: int) -> list[float]:
    """Mean of x[t - window + 1 .. t]; NaN (compares False) before a full window."""
    return [
        sum(x[t - window + 1 : t + 1]) / window if t >= window - 1 else math.nan
        for t in range(len(x))
    ]


def _band(
    entropy: list[float], reference: Mapping | Sequence[Mapping]
) -> tuple[list[bool], list[bool]]:
    runs = [reference] if isinstance(reference, Mapping) else list(reference)
    if not runs:
        raise ValueError("degradation: an empty list of reference runs")
    refs = [_floats(r, "entropy", "reference") for r in runs]
    n = min([len(entropy)] + [len(r) for r in refs])
    top = [max(r[t] for r in refs) for t in range(n)]
    bottom = [min(r[t] for r in refs) for t in range(n)]
    above = [entropy[t] > BAND_FACTOR * top[t] for t in range(n)]
    below = [entropy[t] < bottom[t] / BAND_FACTOR for t in range(n)]
    return above, below


def _surge_flags(entropy: list[float]) -> list[bool]:
    detector = EntropySurgeDetector()  # its defaults: factor 1.5, window 20, min_history 5
    return [detector.update(step, value) for step, value in enumerate(entropy)]


def _reward_below_best(reward: list[float]) -> list[bool]:
    best, flags = -math.inf, []
    for mean in _trailing_means(reward, SMOOTH):
        best = max(best, mean) if math.isfinite(mean) else best
        flags.append(mean < best - REWARD_DROP)
    return flags


def degradation(
    arm: Mapping[str, Sequence[float]],
    reference: Mapping[str, Sequence[float]] | Sequence[Mapping[str, Sequence[float]]] | None,
) -> Degradation:
    """Which criteria of the module docstring fire on `arm` (keys entropy, reward,
    malformed_frac), judged against `reference` (entropy; one run or several seeds; None:
    skip the band criteria), and at which step."""
    entropy = _floats(arm, "entropy", "arm")
    flags: dict[str, tuple[list[bool], int]] = {}
    if reference is not None:
        above, below = _band(entropy, reference)
        flags["entropy_surge"] = (above, BAND_STEPS)
        flags["entropy_collapse"] = (below, BAND_STEPS)
    flags["surge_detector"] = (_surge_flags(entropy), SURGE_STEPS)
    flags["reward_drop"] = (_reward_below_best(_floats(arm, "reward", "arm")), REWARD_WINDOW)
    garble = _trailing_means(_floats(arm, "malformed_frac", "arm"), SMOOTH)
    flags["garble"] = ([g > GARBLE_LEVEL for g in garble], 1)
    fired = {}
    for name in CRITERIA:
        if name in flags:
            step = _run_end(*flags[name])
            if step is not None:
                fired[name] = step
    return Degradation(fired)
