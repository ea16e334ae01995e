"""The goals of docs/benchmarks.md for gpu_e2e: FP8 RL training step with calibration >= 1.5x
BF16 tensorwise, >= 1.35x rowwise, >= 1.15x blockwise; calibration under 5 % of the step at
interval 20; FP8 rollout >= 1.2x BF16. Judged only on a GPU."""

from __future__ import annotations

from device_bench import goal
from e2e.shapes import INTERVAL

TRAIN_GOALS = {"tensorwise": 1.5, "rowwise": 1.35, "blockwise": 1.15}
CALIB_GOAL = 0.05  # calibration cost / step time, at the interval below
ROLLOUT_GOAL = 1.2


def judge(
    train: dict | None, rollout: dict | None, judged: bool, expect: dict | None = None
) -> list[dict]:
    """The goals of what was measured; with `expect` ({"recipes": [...], "models": [...]}) also
    a "not measured" row (value None) for every goal a failed check, error or budget left out."""
    goals: list[dict] = []

    def add(name, target, value, basis, kind, recipe_name, model=None, higher=True):
        unit = "x" if higher else "%"
        extra = {"kind": kind, "recipe": recipe_name, "model": model}
        goals.append(
            goal(name, target, value, higher=higher, unit=unit, basis=basis, judged=judged, **extra)
        )

    expect = expect or {}
    _train_goals(add, train, expect.get("recipes", []))
    _rollout_goals(add, rollout, expect)
    return goals


def _train_rows(train: dict | None) -> tuple[list[dict], str]:
    """The rows the train goals are judged on: projected to 36 layers, else the deepest."""
    if train is None or not train["depths"]:
        return [], "not measured"
    proj = [r for r in train["rows"] if r["projected"]]
    deepest = max(d["layers"] for d in train["depths"])
    rows = proj or [r for r in train["rows"] if r["layers"] == deepest]
    how = "projected to" if proj else "measured at"
    return rows, f"{how} {rows[0]['layers']} layers"


def _train_goals(add, train: dict | None, expected_recipes) -> None:
    rows, basis = _train_rows(train)
    measured = {r["precision"]: r for r in rows}
    names = [r for r in measured if r in TRAIN_GOALS]
    names += [r for r in expected_recipes if r not in measured]
    interval = train["interval"] if train is not None else INTERVAL
    for name in names:
        r = measured.get(name, {})
        title = f"train step {name} (calibration included) vs bf16"
        value = r.get("speedup_calibrated")
        add(title, TRAIN_GOALS[name], value, basis if r else "not measured", "train", name)
    for name in names:
        r = measured.get(name, {})
        title = f"calibration overhead {name} at interval {interval}"
        value, why = r.get("calib_overhead"), basis if r else "not measured"
        add(title, CALIB_GOAL, value, why, "calibration", name, higher=False)


def _rollout_goals(add, rollout: dict | None, expect: dict) -> None:
    seen = set()
    batch = rollout["batch"] if rollout is not None else 64
    for r in (rollout or {}).get("rows", []):
        if r["precision"] != "bf16":
            seen.add((r["model"], r["precision"]))
            title = f"rollout {r['model']} {r['precision']} vs bf16"
            value, name = r.get("speedup"), r["precision"]
            add(title, ROLLOUT_GOAL, value, f"batch {batch}", "rollout", name, model=r["model"])
    for model in expect.get("models", []):
        for name in expect.get("recipes", []):
            if (model, name) not in seen:
                title = f"rollout {model} {name} vs bf16"
                add(title, ROLLOUT_GOAL, None, "not measured", "rollout", name, model=model)
