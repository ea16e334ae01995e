"""The noise table of a finished sweep whose arms are quantization recipes: per arm, the
shadow statistics of its ratio noise, mean +- SE over seeds of per-seed means over steps
>= skip_steps (configs/noise-by-recipe.yaml; docs/fp8.md, "Measured noise by recipe").

    python -m fp8rl.study.noise_table runs/noise-by-recipe
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..utils import run_main

# (column, metric, scale, digits)
COLUMNS = (
    ("probability NMAE (%)", "shadow/nmae_prob", 100.0, 2),
    ("amplification", "shadow/amplification", 1.0, 2),
    ("log-ratio error sd", "shadow/logratio_err_sd", 1.0, 4),
    ("share of abs(e) > 0.223 (%)", "shadow/logratio_err_tail", 100.0, 3),
    ("vanilla lower-clip excess (pp)", "shadow/lower_clip_excess", 100.0, 2),
)


def _cell(stats: dict | None, scale: float, digits: int) -> str:
    stats = stats or {}
    m, se = stats.get("mean"), stats.get("se")
    if m is None:
        return "-"
    return f"{m * scale:.{digits}f}" + (f" ± {se * scale:.{digits}f}" if se is not None else "")


def noise_table(agg: dict) -> str:
    """A markdown table, one row per arm, in the spec's order."""
    lines = [
        "| recipe | seeds | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for arm, a in agg["arms"].items():
        cells = [_cell(a["metrics"].get(key), scale, d) for _, key, scale, d in COLUMNS]
        lines.append(f"| {arm} | {len(a.get('seeds', []))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.noise_table")
    p.add_argument("sweep", help="a finished sweep folder (with aggregate.json)")
    a = p.parse_args(argv)
    path = Path(a.sweep) / "aggregate.json"
    if not path.is_file():
        p.error(f"{path}: no aggregate.json (run `fp8rl sweep` to the end first)")
    print(noise_table(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
