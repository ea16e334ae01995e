"""The end-to-end check's assertions, read from verl's own logs.

Two logs of each `verl.trainer.main_ppo` invocation are read: the metric log of verl's
`file` logger (`VERL_FILE_LOGGER_PATH`, one JSON object a step) and verl's console log
(`step:N - key:value - ...` lines). Both must hold the same steps with the same values, so a
run cut short, a log truncated mid-line or a parser that read nothing is an error, never a
vacuous pass. Each `check_*` raises `CheckError` naming the run, step and metric, and returns
the lines it verified.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

ROLLOUT_DIFF = "training/rollout_probs_diff_mean"
ROLLOUT_DIFF_LIMIT = 1e-2
# logged at every step of a run with shadow_every = interval = 1 (a NaN fraction is left out
# by the worker, so only the metrics defined on any batch are required)
EVERY_STEP = ("actor/calib/lower", "actor/calib/upper", "actor/calib/shadow_step")
EVERY_STEP += ("actor/fp8rl/clipfrac",)  # the fp8rl_calibrated loss's own metric
SHADOW = ("actor/shadow/nmae_prob", "actor/shadow/nmae_ratio", "actor/calib/shadow_tokens")
REFIT = ("actor/calib/refit", "actor/calib/next_lower", "actor/calib/next_upper")
REFIT += ("actor/calib/updated", "actor/calib/pool_steps")
STATE_FILE = "calibration_state.json"
TOL = 1e-9

Metrics = dict[int, dict[str, float]]
_CONSOLE_STEP = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")


class CheckError(AssertionError):
    pass


def _fail(run: str, msg: str):
    raise CheckError(f"{run}: {msg}")


def parse_metric_log(path: Path, run: str = "run") -> Metrics:
    """verl's file logger: {"step": N, "data": {...}} a line. Refuses a missing or empty
    file, a damaged line, a repeated step and a line without metrics."""
    path = Path(path)
    if not path.is_file():
        _fail(run, f"no metric log at {path} (did verl start its file logger?)")
    out: Metrics = {}
    lines = path.read_text().splitlines()
    for no, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            step, data = int(rec["step"]), rec["data"]
        except (ValueError, KeyError, TypeError) as e:
            _fail(run, f"{path}:{no}: not a verl metric line ({e}): {line[:80]!r}")
        if step in out:
            _fail(run, f"{path}:{no}: step {step} logged twice")
        numbers = {k: float(v) for k, v in data.items() if _is_number(v)}
        if not numbers:
            _fail(run, f"{path}:{no}: step {step} has no metrics")
        out[step] = numbers
    if not out:
        _fail(run, f"{path} is empty: no step was logged")
    return out


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def parse_console(text: str, run: str = "run") -> Metrics:
    """verl's console logger: `step:N - key:value - ...` (possibly behind Ray's
    `(TaskRunner pid=...)` prefix). Refuses a text with no such line."""
    out: Metrics = {}
    for line in text.splitlines():
        m = _CONSOLE_STEP.search(line)
        if not m:
            continue
        step, metrics = int(m.group(1)), {}
        for part in m.group(2).split(" - "):
            key, sep, value = part.rpartition(":")
            if not sep:
                continue
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                continue
        if step in out:
            _fail(run, f"console: step {step} logged twice")
        out[step] = metrics
    if not out:
        _fail(run, "console: no 'step:N - ...' line: the run logged no step")
    return out


def _close(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def check_finished(logged: Metrics, console: Metrics, steps: Iterable[int], run: str):
    """The run logged exactly `steps` in both logs, with the same values."""
    steps = list(steps)
    for name, got in (("metric log", logged), ("console", console)):
        if sorted(got) != steps:
            _fail(run, f"{name} has steps {sorted(got)}, expected {steps}: not finished")
    for s in steps:
        shared = set(logged[s]) & set(console[s])
        if len(shared) < min(len(logged[s]), len(console[s])) // 2 or not shared:
            _fail(run, f"step {s}: the console and the metric log share few metrics")
        for k in sorted(shared):
            if not _close(logged[s][k], console[s][k]):
                _fail(run, f"step {s}: {k} is {logged[s][k]} in the metric log, {console[s][k]}")
    return [f"{run}: finished, steps {steps} in both logs"]


def _get(m: Metrics, step: int, key: str, run: str) -> float:
    if step not in m:
        _fail(run, f"step {step} was not logged")
    if key not in m[step]:
        _fail(run, f"step {step}: {key} was not logged")
    return m[step][key]


def check_rollout_sync(m: Metrics, run: str, limit: float = ROLLOUT_DIFF_LIMIT):
    """vLLM's and the actor's log-probs of the rollout agree at every step: the weights
    were synced (vLLM starts from dummy weights)."""
    if not m:
        _fail(run, "no step to check")
    values = {s: _get(m, s, ROLLOUT_DIFF, run) for s in sorted(m)}
    bad = {s: v for s, v in values.items() if not (math.isfinite(v) and v < limit)}
    if bad:
        _fail(run, f"{ROLLOUT_DIFF} not below {limit} at steps {bad}")
    return [f"{run}: {ROLLOUT_DIFF} < {limit} at every step (max {max(values.values()):.2e})"]


def check_stock(m: Metrics, run: str):
    """verl's own worker and loss: no fp8rl metric anywhere."""
    if not m:
        _fail(run, "no step to check")
    extra = sorted({k for s in m for k in m[s] if "calib/" in k or "shadow/" in k})
    if extra:
        _fail(run, f"the stock run logged fp8rl metrics {extra[:3]}")
    for s in sorted(m):
        _get(m, s, "actor/pg_loss", run)
    return [f"{run}: verl's own worker (actor/pg_loss, no calib/shadow metrics)"]


def check_calibrated(
    m: Metrics,
    run: str,
    nominal: tuple[float, float],
    first_update: int = 0,
    pool_window: int | None = None,
):
    """fp8rl's worker with shadow_every = interval = 1 (rule pooled): every step logs the
    bounds and the shadow metrics; every fp8rl step from 1 on refits; each step clips with
    the bounds the previous step's refit chose (`check_bounds_moved` asks that they moved).
    The run's first logged step is fp8rl step `first_update` (the worker's
    update count). With `pool_window` (and a pool_min_clips no step reaches) a refit at
    fp8rl step t pools min(window, t) steps: a resumed run shows so that the pool survived."""
    steps = sorted(m)
    if not steps:
        _fail(run, "no step to check")
    lines = []
    for i, s in enumerate(steps):
        t = first_update + i  # fp8rl's step: the worker's update count
        for k in EVERY_STEP + SHADOW:
            _get(m, s, k, run)
        if _get(m, s, "actor/calib/shadow_step", run) != 1.0:
            _fail(run, f"step {s}: not a shadow step (shadow_every=1)")
        if _get(m, s, "actor/calib/shadow_tokens", run) <= 0:
            _fail(run, f"step {s}: the shadow passes pooled no token")
        if t == 0:
            bounds = (_get(m, s, "actor/calib/lower", run), _get(m, s, "actor/calib/upper", run))
            if not all(_close(a, b) for a, b in zip(bounds, nominal, strict=True)):
                _fail(run, f"step {s}: fp8rl step 0 clipped with {bounds}, not nominal {nominal}")
            if "actor/calib/refit" in m[s]:
                _fail(run, f"step {s}: fp8rl step 0 refit (rule pooled never refits at 0)")
        else:
            for k in REFIT:
                _get(m, s, k, run)
            if pool_window is not None:
                want = min(pool_window, t)
                got = _get(m, s, "actor/calib/pool_steps", run)
                if got != want:
                    _fail(run, f"step {s}: the refit pooled {got:g} steps, expected {want}")
        if i:
            prev = steps[i - 1]
            for side in ("lower", "upper"):
                used = _get(m, s, f"actor/calib/{side}", run)
                chosen = m[prev].get(f"actor/calib/next_{side}")
                if chosen is not None and not _close(used, chosen):
                    _fail(run, f"step {s} clipped with {side} {used}, the refit chose {chosen}")
    refits = [s for i, s in enumerate(steps) if first_update + i >= 1]
    lines.append(f"{run}: calib/*, shadow/* at steps {steps}, refits at steps {refits}")
    return lines


def check_bounds_moved(runs: dict[str, Metrics], nominal: tuple[float, float]):
    """Some step clipped with bounds other than the nominal ones. With `check_calibrated`
    (each step clips with the previous refit's choice) and `check_resumed`, such a step got
    them from a refit. Over all `runs`: a refit whose tokens hold no BF16 lower clip keeps the
    nominal bounds, and on a tiny random model a few refits in a row may do so."""
    moved = [
        f"{run} step {s}"
        for run, m in runs.items()
        for s in sorted(m)
        if not _close(_get(m, s, "actor/calib/lower", run), nominal[0])
        or not _close(_get(m, s, "actor/calib/upper", run), nominal[1])
    ]
    if not moved:
        steps = {run: sorted(m) for run, m in runs.items()}
        _fail("+".join(runs), f"the bounds never left nominal {nominal} at steps {steps}")
    return [f"the bounds moved after a refit: {', '.join(moved)}"]


def check_resumed(first: Metrics, resumed: Metrics, run: str):
    """The resumed run goes on from the saved step with the saved calibration state: its
    first step clips with the bounds the last saved refit chose."""
    last, nxt = max(first), min(resumed)
    if nxt != last + 1:
        _fail(run, f"resumed at step {nxt}, the checkpoint was at step {last}")
    lines = []
    for side in ("lower", "upper"):
        chosen = _get(first, last, f"actor/calib/next_{side}", run)
        used = _get(resumed, nxt, f"actor/calib/{side}", run)
        if not _close(used, chosen):
            _fail(
                run, f"step {nxt} clipped with {side} {used}; before the save {chosen} was chosen"
            )
        lines.append(f"{run}: step {nxt} clipped with the saved {side} bound {used:.6f}")
    return lines


def check_checkpoint(step_dir: Path, updates: int, run: str):
    """fp8rl's calibration state beside verl's actor shards, with the update count."""
    path = Path(step_dir) / "actor" / STATE_FILE
    if not path.is_file():
        _fail(run, f"no {STATE_FILE} in {path.parent}")
    blob = json.loads(path.read_text())
    if blob.get("fp8rl_updates") != updates:
        _fail(run, f"{path}: fp8rl_updates {blob.get('fp8rl_updates')}, expected {updates}")
    shards = [p.name for p in path.parent.iterdir() if p.name.startswith("model_world_size")]
    if not shards:
        _fail(run, f"no verl model shard in {path.parent}")
    return [f"{run}: {STATE_FILE} (updates {updates}) beside verl's shards {sorted(shards)}"]
