"""The loss modes of `loss.mode`: one table that config validation, the step and the docs read.

A mode names a registered policy loss (rl/losses.py) and says where its clip bounds come
from and what its defaults are; adding a mode is one entry here (and a loss, if it needs a new
one). grpo, dapo, relax_lower and calibrated share the one clipped surrogate, ppo_clip: they
differ in their bound source and defaults only; gspo and gspo_calibrated are the same pair for
the sequence-level surrogate, gspo.

Beside the table, the words the modes and Calibrated Clipping speak, one each: where a loss's
clip bounds come from (`BoundSource`), what a `CalibrationState` does with a refit
(`CalibrationMode`), and whether the ratio a loss clips is a token's or a sequence's
(`RatioLevel`).

"Does this run move its bounds?" has one answer: its bound source is `calibrated`, which makes
its state's mode `calibrate`. Members are plain strings too (`BoundSource.RELAXED ==
"relaxed"`), so configs, JSON checkpoints and messages keep the words they had.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class BoundSource(StrEnum):
    """The clip bounds (L, H) of a loss mode (LOSS_MODES below)."""

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


# ---------------------------------------------------------------- the loss modes
@dataclass(frozen=True)
class LossMode:
    name: str  # the value of loss.mode
    loss: str  # the registered policy loss (rl.losses.POLICY_LOSSES)
    bounds: BoundSource = BoundSource.NOMINAL  # where the clip bounds come from
    eps_high: float = 0.2  # the default of loss.eps_high
    eps_low: float = 0.2  # the default of loss.eps_low
    level: RatioLevel = RatioLevel.TOKEN  # the ratio the loss clips: a token's or a response's
    agg: str = "seq-mean-token-mean"  # the default of loss.agg
    dynamic_sampling: bool = False  # the default of loss.dynamic_sampling
    # loss keyword -> the loss config field that feeds it (None values are left out)
    options: tuple[tuple[str, str], ...] = ()
    summary: str = ""  # one line for docs and --help

    def __post_init__(self):
        object.__setattr__(self, "bounds", as_member(BoundSource, self.bounds, "bound source"))
        object.__setattr__(self, "level", as_member(RatioLevel, self.level, "ratio level"))

    @property
    def moves_bounds(self) -> bool:
        """Are the clip bounds refit during the run (Calibrated Clipping)?"""
        return self.bounds is BoundSource.CALIBRATED

    def loss_options(self, section) -> dict:
        """The loss keywords this mode feeds from the loss config `section` (duck-typed: any
        object with the fields named in `options`), None values left out."""
        values = {kw: getattr(section, name) for kw, name in self.options}
        return {kw: v for kw, v in values.items() if v is not None}


_DUAL = (("dual_clip", "dual_clip"),)
# GSPO's clip range (its paper, verl): a long response's ratio strays far less from 1 than a token's
_GSPO = dict(eps_low=3e-4, eps_high=4e-4, level=RatioLevel.SEQUENCE)

LOSS_MODES: dict[str, LossMode] = {
    m.name: m
    for m in (
        LossMode("grpo", "ppo_clip", options=_DUAL, summary="PPO clip with GRPO advantages"),
        LossMode(
            "dapo",
            "ppo_clip",
            eps_high=0.28,
            agg="token-mean",
            dynamic_sampling=True,
            options=_DUAL,
            summary="clip-higher, token-mean, dynamic sampling",
        ),
        LossMode("cispo", "cispo", summary="clipped IS weight, gradient through every token"),
        LossMode(
            "bapo",
            "bapo",
            options=(("target", "bapo_target"),),
            summary="bounds adapted to a positive-update share",
        ),
        LossMode(
            "relax_lower",
            "ppo_clip",
            bounds=BoundSource.RELAXED,
            options=_DUAL,
            summary="a fixed, lower lower bound (loss.relaxed_lower)",
        ),
        LossMode(
            "calibrated",
            "ppo_clip",
            bounds=BoundSource.CALIBRATED,
            options=_DUAL,
            summary="Calibrated Clipping: bounds refit from BF16 shadow passes",
        ),
        LossMode("gspo", "gspo", **_GSPO, summary="GSPO: PPO clip on the sequence ratio"),
        LossMode(
            "gspo_calibrated",
            "gspo",
            bounds=BoundSource.CALIBRATED,
            **_GSPO,
            summary="GSPO with Calibrated Clipping of the sequence ratios",
        ),
    )
}
