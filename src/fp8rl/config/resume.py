"""What `--resume` may change: a resumed run's config against its checkpoint's."""

from __future__ import annotations

from typing import Any

# The one list of config keys a resumed run may change (a key or a whole section). Every other
# key changes the math (loss, precisions, seeds, batch shapes, lr, calibration, task, model) and
# must equal the checkpoint's: new keys are covered without anyone remembering to list them.
RESUME_MAY_CHANGE = (
    "name",
    "log",  # where and how often to log, checkpoint and evaluate
    "train.steps",  # a run may be extended
    "train.fp8_check_finite",  # only decides whether a non-finite input is located
    "model.device",  # e.g. continue a CPU run on a GPU
    "model.init_weights",  # the start weights: a resumed run loads the checkpoint's instead
    "model.warm_start",
    "warm_start",
)


def _leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        # sections are dataclasses; free-form mappings (model.tiny, task.options) are one value
        if isinstance(v, dict) and not prefix:
            out.update(_leaves(v, key))
        else:
            out[key] = v
    return out


def resume_differences(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) of each key outside RESUME_MAY_CHANGE that differs;
    both configs as JSON-like dicts. A key the saved config lacks (an older fp8rl) is skipped."""
    a, b = _leaves(saved), _leaves(current)
    may = RESUME_MAY_CHANGE
    diff = []
    for key in sorted(b):
        if any(key == m or key.startswith(m + ".") for m in may) or key not in a:
            continue
        if a[key] != b[key]:
            diff.append((key, a[key], b[key]))
    return diff
