"""A `fp8rl sweep` in a process of its own, for the tests that kill it."""

from __future__ import annotations

import subprocess
import sys


def start_sweep(spec_path, out) -> subprocess.Popen:
    """One worker, no progress, in a new session: a test can kill the sweep, or its whole
    group, without signalling pytest."""
    return subprocess.Popen(
        [sys.executable, "-m", "fp8rl", "sweep", str(spec_path), "--out", str(out)]
        + ["--jobs", "1", "--no-progress"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
