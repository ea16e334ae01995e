"""Errors shared by every layer. Each names the field and the value that was wrong."""


class Fp8rlError(Exception):
    """Base class of the errors fp8rl raises on purpose (the CLI prints them as one line)."""


class ConfigError(Fp8rlError, ValueError):
    """A configuration key has a bad value."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}' = {value!r} is invalid: expected {allowed}")


class CheckpointError(Fp8rlError):
    """A checkpoint or model folder is missing, incomplete or malformed."""


class DataError(Fp8rlError, ValueError):
    """A data file or one of its rows is malformed."""
