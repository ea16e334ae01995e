"""What a run is, and every rule that can refuse one (docs/architecture.md).

A config is a `RunConfig` of section dataclasses, each checking its own fields; `load_config`
reads YAML and `key=value` overrides into it and `validate` adds the rules that span sections
and the files a run starts from. Nothing here runs a step or writes a file.
"""

from .coerce import parse_override, set_dotted
from .load import config_from_dict, load_config, merge
from .resume import RESUME_MAY_CHANGE, resume_differences
from .sections import (
    CalibrationConfig,
    LogConfig,
    LossConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    WarmStartConfig,
)

__all__ = [
    "RESUME_MAY_CHANGE",
    "CalibrationConfig",
    "LogConfig",
    "LossConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TaskConfig",
    "TrainConfig",
    "WarmStartConfig",
    "config_from_dict",
    "load_config",
    "merge",
    "parse_override",
    "resume_differences",
    "set_dotted",
]
