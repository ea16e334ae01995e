"""The words of Calibrated Clipping, one each: where a loss's clip bounds come from
(`BoundSource`), what a `CalibrationState` does with a refit (`CalibrationMode`), and whether
the ratio a loss clips is a token's or a sequence's (`RatioLevel`).

"Does this run move its bounds?" has one answer: its bound source is `calibrated`, which makes
its state's mode `calibrate`. Members are plain strings too (`BoundSource.RELAXED ==
"relaxed"`), so configs, JSON checkpoints and messages keep the words they had.
"""

from __future__ import annotations

from enum import Enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class BoundSource(StrEnum):
    """The clip bounds (L, H) of a loss mode (rl/loss_modes.py)."""

    NOMINAL = "nominal"  # (1 - eps_low, 1 + eps_high)
    RELAXED = "relaxed"  # (loss.relaxed_lower, 1 + eps_high)
    CALIBRATED = "calibrated"  # the CalibrationState's bounds, refit from BF16 shadow passes


class RatioLevel(StrEnum):
    """What one clipped ratio belongs to; the shadow diagnostics and the calibration follow it."""

    TOKEN = "token"  # r_i = pi_theta / pi_old of one token (PPO-clip and the others)
    SEQUENCE = "sequence"  # s_i = exp(mean_t log r_it) of one response (GSPO)


class CalibrationMode(StrEnum):
    """What a CalibrationState does with a refit's result."""

    CALIBRATE = "calibrate"  # adopt the new bounds from the next step
    DIAGNOSE = "diagnose"  # record them, keep the bounds (vanilla FP8 with diagnostics)

    @classmethod
    def for_source(cls, source: BoundSource | str) -> CalibrationMode:
        """A state moves its bounds exactly when the loss clips at calibrated bounds."""
        calibrated = as_member(BoundSource, source) is BoundSource.CALIBRATED
        return cls.CALIBRATE if calibrated else cls.DIAGNOSE


def as_member(kind: type[StrEnum], value, what: str | None = None):
    """The member of `kind` named `value` (a member or its string); ValueError naming every
    valid word otherwise."""
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(m.value for m in kind)
        raise ValueError(f"unknown {what or kind.__name__} {value!r}; valid: {valid}") from None
