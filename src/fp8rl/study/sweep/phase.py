"""The phase diagram of a grid sweep: study/sweep/cells.py's results as a markdown table and
heatmaps of the seed-paired differences, one per outcome (columns: the grid's first axis;
rows: the other axes' combinations).

    python -m fp8rl.study.sweep.phase runs/study-long-search [--ref bf16] [--arm fp8]

writes OUT/cells.json, OUT/cells.md and OUT/phase_*.png, and prints the table and the cell
`choose_cell` picks.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

from ...errors import Fp8rlError, one_line
from ...utils import atomic_write_text, run_main, save_figure
from .cells import CELLS_FILE, CELLS_MD, cell_results, choose_cell
from .spec import SPEC_FILE, load_spec
from .stats import write_json

# (outcome, label, scale, digits): the table's paired columns; the first three are plotted
COLUMNS = (
    ("entropy_drift", "entropy drift (nats/token)", 1.0, 3),
    ("reward_last", "reward, last W", 1.0, 3),
    ("garble_last", "garble rate, last W", 1.0, 3),
    ("length_last", "response length, last W", 1.0, 1),
    ("accuracy_end", "greedy test accuracy, end", 1.0, 3),
    ("lower_clip_excess", "lower-clip excess (pp)", 100.0, 2),
)
# already a paired difference within each run (FP8 minus its own BF16 shadow): the arm's own
# value, not arm - reference (a BF16 reference runs no shadow)
OWN = ("lower_clip_excess",)
PLOTTED = 3


def _ci(stats: dict, scale: float, digits: int) -> str:
    m, ci = stats.get("mean"), stats.get("ci95")
    if m is None:
        return "-"
    text = f"{m * scale:+.{digits}f}"
    return text + (f" [{ci[0] * scale:+.{digits}f}, {ci[1] * scale:+.{digits}f}]" if ci else "")


def _plain(stats: dict, digits: int) -> str:
    m, se = stats.get("mean"), stats.get("se")
    if m is None:
        return "-"
    return f"{m:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else "")


def _fired(judged: dict) -> str:
    kinds = sorted({k for j in judged.values() for k in j["fired"]})
    return ", ".join(kinds) if kinds else "-"


def cells_table(results: dict, arm: str = "fp8") -> str:
    """One row per cell: the reference's reward and entropy at the end (mean ± SE), the
    seed-paired arm - reference differences (mean [95 % t-interval]), the degraded seeds."""
    ref, w = results["ref"], results["final_window"]
    heads = [f"{ref} reward, last {w}", f"{ref} entropy, last {w}", f"{ref} stable"]
    heads += [
        (f"{arm} {label}" if k in OWN else f"Δ {label.replace('last W', f'last {w}')}")
        for k, label, _, _ in COLUMNS
    ]
    heads += [f"{arm} seeds degraded (criteria)"]
    lines = ["| cell | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for c in results["cells"]:
        if arm not in c["compare"]:
            continue
        mine, out = c["compare"][arm], c["ref"]["outcomes"]
        cells = [
            _plain(out["reward_last"], 3),
            _plain(out["entropy_last"], 3),
            ("yes" if c["ref"]["stable"] else f"no ({_fired(c['ref']['degradation'])})")
            + ("" if c["ref"]["learns"] else ", does not learn"),
        ]
        cells += [
            _ci(mine["outcomes" if k in OWN else "paired"][k], scale, d)
            for k, _, scale, d in COLUMNS
        ]
        n = len(mine["degradation"])
        cells.append(f"{mine['degraded_seeds']}/{n} ({_fired(mine['degradation'])})")
        lines.append(f"| {c['name'] or '-'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _layout(results: dict):
    """(column names, row names, {(row, column): cell}) over the grid's first axis."""
    cells = results["cells"]
    axes = list(cells[0]["values"]) if cells else []
    if not axes:
        return [""], [""], {("", ""): cells[0]} if cells else {}
    cols = list(dict.fromkeys(c["values"][axes[0]] for c in cells))
    rows = list(dict.fromkeys("--".join(c["values"][a] for a in axes[1:]) for c in cells))
    grid = {("--".join(c["values"][a] for a in axes[1:]), c["values"][axes[0]]): c for c in cells}
    return cols, rows, grid


def _paired_grid(results: dict, arm: str, key: str):
    """(columns, rows, [[STATS of the cell or {}]]) of one outcome's paired difference."""
    cols, rows, grid = _layout(results)
    return (
        cols,
        rows,
        [
            [
                (grid[r, c]["compare"].get(arm, {}).get("paired", {}).get(key) or {})
                if (r, c) in grid
                else {}
                for c in cols
            ]
            for r in rows
        ],
    )


def _heatmap(plt, cols, rows, vals, scale: float, digits: int):
    """A figure of the cells colored by mean (0 white; NaN where a cell has none), each
    annotated with its mean and 95 % interval; None when no cell has a mean."""
    means = [
        [(v.get("mean") if v.get("mean") is not None else math.nan) * scale for v in row]
        for row in vals
    ]
    finite = [abs(m) for m in itertools.chain(*means) if not math.isnan(m)]
    if not finite:
        return None
    top = max(finite) or 1.0
    fig, ax = plt.subplots(figsize=(1.9 * len(cols) + 2, 0.9 * len(rows) + 1.6))
    im = ax.imshow(means, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
    for i, j in itertools.product(range(len(rows)), range(len(cols))):
        dark = not math.isnan(means[i][j]) and abs(means[i][j]) > 0.6 * top
        text = _ci(vals[i][j], scale, digits).replace(" [", "\n[")
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="w" if dark else "k")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig, ax


def plot_phase(out_dir, results: dict, arm: str = "fp8") -> list[Path]:
    """OUT/phase_OUTCOME.png for the first PLOTTED columns: each cell colored by the mean
    seed-paired difference (0 white), annotated with the mean and its 95 % t-interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, label, scale, digits in COLUMNS[:PLOTTED]:
        cols, rows, vals = _paired_grid(results, arm, key)
        drawn = _heatmap(plt, cols, rows, vals, scale, digits)
        if drawn is None:
            continue
        fig, ax = drawn
        label = label.replace("last W", f"last {results['final_window']} steps")
        title = f"{arm} - {results['ref']}: {label}\nseed-paired mean [95 % t-interval]"
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        path = Path(out_dir) / f"phase_{key}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_cells(spec, out_dir, ref: str = "bf16", arm: str = "fp8") -> dict:
    """cell_results + the chosen cell into OUT/cells.json, the table and plots beside it."""
    own = list(spec.arm_specs or spec.arms)
    if arm not in own:  # an empty or unknown --arm: a table of nothing, files named for it
        raise Fp8rlError(f"sweep.phase: --arm {arm!r} is no arm of the spec (arms {own})")
    results = cell_results(spec, out_dir, ref)
    results["chosen"] = choose_cell(results, arm)
    write_json(Path(out_dir) / CELLS_FILE, results)
    plots = plot_phase(out_dir, results, arm)
    text = (
        f"# cells: {arm} against {ref}, paired by seed\n\n{cells_table(results, arm)}\n\n"
        f"{chosen_text(results['chosen'])}\n\n"
        + "\n".join(f"![{p.stem}]({p.name})" for p in plots)
        + "\n"
    )
    atomic_write_text(Path(out_dir) / CELLS_MD, text)
    return results


def chosen_text(chosen: dict) -> str:
    if chosen["cell"] is None:
        return f"No cell chosen, no verdict: {chosen['why']}"
    return f"Chosen cell: `{chosen['cell']}` ({chosen['why']})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.sweep.phase")
    p.add_argument("out", help="a finished grid sweep's folder (holds spec.json)")
    p.add_argument("--ref", default="bf16", help="the reference arm of each cell")
    p.add_argument("--arm", default="fp8", help="the arm the table, plots and choice read")
    a = p.parse_args(argv)
    spec_path = Path(a.out) / SPEC_FILE
    if not spec_path.is_file():
        p.error(f"{spec_path} not found: run `fp8rl sweep` first")
    try:
        results = write_cells(load_spec(spec_path), a.out, a.ref, a.arm)
    except (Fp8rlError, OSError) as e:
        p.error(one_line(e))
    print(cells_table(results, a.arm))
    chosen = results["chosen"]
    if chosen["cell"] is None:
        print("\n" + chosen_text(chosen))
        return 1
    print(f"\nchosen cell: {chosen['cell']} ({chosen['why']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
