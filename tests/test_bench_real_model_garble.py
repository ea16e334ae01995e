"""bench/real_model_garble.py: docs/real-model/garble-rates.md is what the script prints
from the committed samples, so the documented rates follow the garble definition."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_report_is_the_scripts_output():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_model_garble.py")],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    doc = (ROOT / "docs" / "real-model" / "garble-rates.md").read_text(encoding="utf-8")
    assert proc.stdout == doc
    assert "Rewards that differ from the run's logged ones: 0 of 600." in doc
