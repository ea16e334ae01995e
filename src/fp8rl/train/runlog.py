"""Per-step metrics: one JSONL line per step, optional TensorBoard and Weights & Biases, a rich
progress bar, and the entropy-surge detector that flags a step in them."""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
import time
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import DataError, Fp8rlError, os_errors
from ..utils import append_text, atomic_write_text

METRICS_FILE = "metrics.jsonl"
RESPONSES_FILE = "responses.jsonl"  # log.response_stats: one row per response at shadow steps
SAMPLES_FILE = "samples.jsonl"  # log.samples: a few sampled responses a step


def to_float(value) -> float | None:
    if torch.is_tensor(value):
        value = value.detach().float().cpu().item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    return None


def warn(text: str) -> None:
    """A one-line warning on stderr (not `warnings`: the user needs no source location)."""
    print(f"fp8rl: warning: {text}", file=sys.stderr, flush=True)


def read_metrics(
    run_dir: str | Path, *, quiet: bool = False, name: str = METRICS_FILE
) -> list[dict]:
    """Every valid row of RUN/metrics.jsonl (or RUN/`name`). A corrupt line (cut by a crash,
    overwritten) is skipped with a warning naming the file and line; the rows after it are kept."""
    return [row for _, row in numbered_rows(Path(run_dir) / name, quiet=quiet)]


def readable_jsonl(path: Path) -> Path | None:
    """`path`, else its gzipped copy `path`.gz, else None."""
    path = Path(path)
    if path.is_file():
        return path
    zipped = path.with_name(path.name + ".gz")
    return zipped if zipped.is_file() else None


def numbered_rows(path: Path, *, quiet: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, row) of every line of the JSONL file `path` that is a JSON object with an
    integer "step"; any other line is skipped with a warning. Nothing a line holds raises.
    Where `path` is missing, `path`.gz is read in its place (a committed study's raw runs)."""
    path = readable_jsonl(path)
    if path is None:
        return
    opener = gzip.open if path.suffix == ".gz" else open
    # a damaged gzip stream (bad header, cut, bad CRC) is one line naming the file, not a
    # traceback: its rows cannot be told apart from what is lost
    damaged = (EOFError, zlib.error, gzip.BadGzipFile)
    with os_errors("read", path, cls=DataError, also=damaged), opener(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            # ValueError: also an integer of more digits than Python parses
            except (ValueError, RecursionError):
                row = None
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                if not quiet:
                    warn(f"{path} line {number} is not a metrics row (corrupt JSON?): skipped")
                continue
            yield number, row


def restart_jsonl(run_dir: str | Path, name: str, resume_step: int | None) -> Path:
    """RUN/`name` emptied, or on resume holding only the rows of steps the checkpoint holds.
    Rewritten atomically: a kill or a full disk during it keeps the old file whole."""
    path = Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # a killed rewrite's temporary file (fit holds the folder's lock: no live writer owns one)
    for stale in path.parent.glob(f".{name}.*.tmp"):
        stale.unlink(missing_ok=True)
    kept = (
        []
        if resume_step is None
        else [r for r in read_metrics(run_dir, name=name) if r["step"] < resume_step]
    )
    text = "".join(json.dumps(r) + "\n" for r in kept)
    atomic_write_text(path, text, note="its earlier rows are intact")
    return path


def append_jsonl(path: Path, rows: list[dict]) -> None:
    append_text(path, "".join(json.dumps(r) + "\n" for r in rows), operation="append rows to")


class MetricsLog:
    """Appends a JSON line per step; on resume, drops the steps after the checkpoint. `config`
    (the run's config as a dict) turns on W&B when its `log.wandb` is set, and is logged there."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        resume_step: int | None = None,
        tensorboard: bool = False,
        config: dict | None = None,
    ):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # first: a missing or failing wandb stops the run before any log file is touched
        self.wandb = None
        settings = (config or {}).get("log", {}).get("wandb")
        if settings is not None:
            self.wandb = _start_wandb(self.path.parent, settings, config)
        # the rows of steps the checkpoint holds; a corrupt line is dropped, not what follows
        restart_jsonl(run_dir, METRICS_FILE, resume_step)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard is an optional extra
                raise ImportError(
                    "log.tensorboard=true needs `pip install fp8rl[tensorboard]`"
                ) from e
            self.tb = SummaryWriter(str(self.path.parent / "tensorboard"))

    def write(self, step: int, metrics: dict) -> dict:
        row = {"step": step}
        for k, v in metrics.items():
            f = to_float(v)
            row[k] = f if f is not None or not isinstance(v, str) else v
        append_text(self.path, json.dumps(row) + "\n", operation="append a metrics row to")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, float):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, float)}
            self.wandb.log(scalars, step=step)
        return row

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _start_wandb(run_dir: Path, settings: dict, config: dict):
    try:
        import wandb
    except ImportError:  # an optional extra; a one-line CLI error, not a traceback
        raise Fp8rlError(
            "log.wandb is set but wandb is not installed: `pip install fp8rl[wandb]`"
        ) from None
    # a resumed run is a new W&B run: its steps restart below the old run's last step, which
    # W&B would drop from the old run
    try:
        return wandb.init(
            project=settings["project"],
            mode=settings.get("mode"),
            name=config.get("name"),
            dir=str(run_dir),
            config=config,
        )
    except Exception as e:  # not logged in, no network in online mode, ...: wandb's own words
        message = " ".join(str(e).split())
        raise Fp8rlError(f"log.wandb: W&B could not start a run: {message}") from e


class CounterBar:
    """A rich bar "DESCRIPTION ━━━ 3/12 [UNIT] [elapsed] [remaining] [INFO]"; silent and free
    of rich when disabled. The one rich set-up behind the training, sweep and warm-start bars."""

    def __init__(
        self,
        total: int,
        description: str,
        *,
        completed: int = 0,
        enabled: bool = True,
        unit: str = "",
        bar_width: int | None = 40,
        bold: bool = False,
        elapsed: bool = False,
        remaining: bool = False,
        info: bool = False,
    ):
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        columns = [
            TextColumn("[bold]{task.description}" if bold else "{task.description}"),
            BarColumn(bar_width=bar_width),
            MofNCompleteColumn(),
        ]
        columns += [TextColumn(unit)] if unit else []
        columns += [TimeElapsedColumn()] if elapsed else []
        columns += [TimeRemainingColumn()] if remaining else []
        columns += [TextColumn("{task.fields[info]}")] if info else []
        # stderr: stdout holds a command's result (`fp8rl train > summary.json` is JSON)
        console = Console(stderr=True)
        self.plain = None if console.is_terminal else PlainLines(total, description, completed)
        if self.plain is not None:  # a log file or a pipe: rich would draw nothing till the end
            return
        self.bar = RichProgress(*columns, console=console)
        self.task = self.bar.add_task(description, total=total, completed=completed, info="")
        self.bar.start()

    def __bool__(self) -> bool:
        return self.enabled

    def update(
        self,
        *,
        advance: int | None = None,
        completed: int | None = None,
        description: str | None = None,
        info: str | None = None,
    ) -> None:
        if not self.enabled:
            return
        if self.plain is not None:
            self.plain.update(advance, completed, description, info)
            return
        fields = {"info": info} if info is not None else {}
        self.bar.update(
            self.task, advance=advance, completed=completed, description=description, **fields
        )

    def close(self) -> None:
        if self.enabled and self.plain is not None:
            self.plain.line()
        elif self.enabled:
            self.bar.stop()


class PlainLines:
    """A progress bar's state as a plain stderr line, at each tenth of the total and at least
    once a minute: what a log file or a pipe can show (and a kill does not throw away)."""

    EVERY_S = 60.0

    def __init__(self, total: int, description: str, completed: int):
        self.total, self.description, self.completed, self.info = total, description, completed, ""
        self.shown, self.at = -1, time.monotonic()

    def update(self, advance, completed, description, info) -> None:
        self.completed = completed if completed is not None else self.completed + (advance or 0)
        self.description = description or self.description
        self.info = info if info is not None else self.info
        tenth = self.completed * 10 // max(self.total, 1)
        if tenth != self.shown or time.monotonic() - self.at >= self.EVERY_S:
            self.line()

    def line(self) -> None:
        self.shown = self.completed * 10 // max(self.total, 1)
        self.at = time.monotonic()
        text = f"{self.description} {self.completed}/{self.total} {self.info}".rstrip()
        print(text, file=sys.stderr, flush=True)


class Progress:
    """The training bar: step count, times, and reward, entropy and the clip bounds."""

    def __init__(self, total: int, start: int, description: str, enabled: bool = True):
        self.bar = CounterBar(
            total,
            description,
            completed=start,
            enabled=enabled,
            bold=True,
            elapsed=True,
            remaining=True,
            info=True,
        )

    def update(self, row: dict):
        if not self.bar:
            return
        parts = []
        for key, label in (
            ("rollout/reward", "reward"),
            ("rollout/entropy", "entropy"),
            ("calib/lower", "L"),
            ("calib/upper", "H"),
        ):
            if isinstance(row.get(key), float):
                parts.append(f"{label} {row[key]:.3f}")
        self.bar.update(advance=1, info="  ".join(parts))

    def close(self):
        self.bar.close()


class RowsOnlyLog:
    """MetricsLog's interface without a file: what ranks other than 0 keep of each step."""

    def write(self, step: int, metrics: dict) -> dict:
        row = {"step": step}
        for k, v in metrics.items():
            f = to_float(v)
            row[k] = f if f is not None or not isinstance(v, str) else v
        return row

    def close(self) -> None:
        pass


class EntropySurgeDetector:
    """Flags a step whose entropy exceeds `factor` times the median of the previous
    `window` steps' entropies. Needs `min_history` earlier steps before it can flag; a
    non-finite entropy is flagged and kept out of the window."""

    def __init__(self, factor: float = 1.5, window: int = 20, min_history: int = 5):
        bad = isinstance(factor, bool) or not isinstance(factor, (int, float))
        if bad:
            raise ValueError(f"factor must be a Python number, got {factor!r}")
        if not 0.0 < float(factor) < math.inf:
            raise ValueError(f"factor = {factor!r} is outside (0.0, inf)")
        self.factor = float(factor)
        for name, v in (("window", window), ("min_history", min_history)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if min_history > window:
            raise ValueError(f"min_history = {min_history} exceeds window = {window}")
        self.window, self.min_history = window, min_history
        self._values: deque[float] = deque(maxlen=window)
        self.surges: list[int] = []

    def update(self, step: int, entropy) -> bool:
        """Record this step's mean entropy (float or 0-d tensor); True if it is a surge."""
        value = float(entropy)
        if not math.isfinite(value):
            self.surges.append(step)
            return True
        surge = len(self._values) >= self.min_history and value > self.factor * statistics.median(
            self._values
        )
        self._values.append(value)
        if surge:
            self.surges.append(step)
        return surge

    @property
    def first_surge(self) -> int | None:
        return self.surges[0] if self.surges else None

    def state_dict(self) -> dict:
        return {
            "factor": self.factor,
            "window": self.window,
            "min_history": self.min_history,
            "values": list(self._values),
            "surges": list(self.surges),
        }

    def load_state_dict(self, state: dict) -> None:
        expected = {"factor", "window", "min_history", "values", "surges"}
        if set(state) != expected:
            raise ValueError(
                f"EntropySurgeDetector.load_state_dict: keys {sorted(state)}, "
                f"expected {sorted(expected)}"
            )
        self.__init__(state["factor"], state["window"], state["min_history"])
        self._values.extend(float(v) for v in state["values"])
        self.surges = [int(s) for s in state["surges"]]
