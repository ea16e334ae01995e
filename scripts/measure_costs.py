"""What the README's commands cost in CPU seconds (user + system of the command and its
children), measured here and written to docs/costs.json: on a shared machine wall time
measures the neighbours, CPU time the command.

    python scripts/measure_costs.py            # writes docs/costs.json

Each command runs in a fresh temporary folder with its own empty warm-start cache
(FP8RL_CACHE), so a cost includes whatever the command builds on a fresh clone.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FP8RL = [sys.executable, "-m", "fp8rl"]
COMMANDS = {
    "fp8rl demo --quick": [*FP8RL, "demo", "--quick", "--out", "{tmp}/demo-quick"],
}


def measure(argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="fp8rl-costs-") as tmp:
        env = {**os.environ, "FP8RL_CACHE": f"{tmp}/cache", "GOMP_SPINCOUNT": "0"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            [a.format(tmp=tmp) for a in argv],
            env=env,
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1)}


def main() -> int:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    costs = {name: measure(argv) for name, argv in COMMANDS.items()}
    out = {
        "commit": commit or "unknown",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "note": "cpu_s: user + system seconds of the command and its children; wall_s on a "
        "shared machine is no promise",
        "costs": costs,
    }
    (REPO / "docs" / "costs.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
