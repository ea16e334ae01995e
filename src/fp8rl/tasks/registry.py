"""Tasks by name: get_task("arithmetic", digits=3) builds the task from its config fields."""

from __future__ import annotations

from dataclasses import fields

from fp8rl.errors import ConfigError

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .arithmetic_qa import ArithmeticQAConfig, ArithmeticQATask
from .base import Task
from .chain_arithmetic import ChainArithmeticConfig, ChainArithmeticTask
from .math_task import MathConfig, MathTask

TASKS: dict[str, tuple[type[Task], type]] = {
    "arithmetic": (ArithmeticTask, ArithmeticConfig),
    "math": (MathTask, MathConfig),
    "chain_arithmetic": (ChainArithmeticTask, ChainArithmeticConfig),
    "arithmetic_qa": (ArithmeticQATask, ArithmeticQAConfig),
}


def get_task(name: str, **config) -> Task:
    """A task by registry name; keyword arguments are fields of its config dataclass."""
    if name not in TASKS:
        raise ConfigError("task", name, "one of " + ", ".join(repr(n) for n in TASKS))
    task_cls, config_cls = TASKS[name]
    known = {f.name for f in fields(config_cls)}
    for key in config:
        if key not in known:
            raise ConfigError(
                f"{name}.{key}",
                config[key],
                "a field of " + config_cls.__name__ + f" ({', '.join(sorted(known))})",
            )
    return task_cls(config_cls(**config))
