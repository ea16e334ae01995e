"""`fp8rl sweep`: every arm of a spec once per seed, then statistics over seeds.

runner.py runs the sweep (`run_sweep`), workers.py its processes, memory.py how many fit;
spec.py and grid.py read the spec, aggregation.py, stats.py, cells.py and phase.py turn finished
runs into numbers, plots.py into figures.

    from fp8rl.study.sweep import run_sweep, aggregate, load_runs
"""

from __future__ import annotations

__all__ = ["run_sweep", "aggregate", "load_runs", "load_spec", "usable_cores"]


def __getattr__(name: str):
    # lazy: run_checks imports sweep.spec, and runner imports run_checks, so an eager import
    # of runner here would close a circle through this package; no submodule may be named
    # like a name in __all__, as once imported it would shadow it (hence aggregation.py)
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
