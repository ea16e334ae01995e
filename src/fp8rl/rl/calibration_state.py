"""The clip bounds a trainer uses, when the shadow passes run and the bounds are refit, and the
pool of shadow-step statistics the `pooled` rule fits on (docs/rl.md, "Calibrated Clipping").

`CalibrationState` is the one owner of two questions a step asks: "is this a shadow step?"
(`is_shadow_step`) and "what are this step's clip bounds?" (`clip_bounds`)."""

from __future__ import annotations

import dataclasses
import zlib
from collections import deque
from dataclasses import dataclass, field, fields

import torch

from ._shapes import as_bool_mask, broadcast_advantages, check_bounds, check_same_shape
from .calibration import (
    RULES,
    CalibrationResult,
    CalibrationRule,
    calibrate_bounds,
    check_rule,
    pair,
)
from .loss_modes import BoundSource, CalibrationMode, RatioLevel, as_member

# The fields of a calibration config section (config.CalibrationConfig) that a state
# takes under the same name; from_config reads them by name, so rl/ needs no import of train/.
SECTION_FIELDS = (
    "interval",
    "rule",
    "shadow_every",
    "pool_window",
    "pool_min_clips",
    "pool_max_tokens",
    "min_tokens",
    "lower_min",
    "upper_max",
)


# The fields of the run's plan a state holds (CalibrationState): set by whoever builds the state,
# never checkpointed, so a resumed run takes them from its config.
RUN_FIELDS = ("shadow_passes", "refits", "relaxed_lower")

# The clip range the default caps (0.05, 0.1) were set for: GRPO's eps_low = eps_high = 0.2.
CAP_REFERENCE_EPS = 0.2


def level_caps(
    max_step: tuple[float, float], nominal: tuple[float, float], level: RatioLevel | str
) -> tuple[float, float]:
    """The caps (delta_L, delta_H) of a refit at this ratio level. Token level: `max_step` as
    given. Sequence level: the same fractions of the clip range, max_step x eps / 0.2 with
    (eps_low, eps_high) = (1 - l0, h0 - 1) the nominal range, since GSPO's range (3e-4, 4e-4)
    is hundreds of times narrower than the range the caps were set for."""
    if as_member(RatioLevel, level, "ratio level") is RatioLevel.TOKEN:
        return max_step
    (d_low, d_up), (l0, h0) = max_step, nominal
    return d_low * (1 - l0) / CAP_REFERENCE_EPS, d_up * (h0 - 1) / CAP_REFERENCE_EPS


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass
class CalibrationState:
    """Bounds, cadence, settings, history and pool of Calibrated Clipping.

    Shadow steps are 0, shadow_every, 2 shadow_every, ... (shadow_every defaults to interval).
    `observe` takes each shadow step's statistics; the rule's row (`rule_row`, a row of
    calibration.RULES) says how. A pooling rule (`pooled`, `direct-first`): statistics of
    steps >= first_step enter the pool, and the bounds are refit at steps t >= first_step with
    t % interval == 0 on the newest pooled steps, until they hold pool_min_clips BF16 lower
    clips or pool_window steps. `paper`: no pool, a refit on the step's own tokens at every
    t % interval == 0, step 0 included. `uncapped_first_refit`: until a refit has moved the
    bounds (none in the history is `updated`), a refit goes straight to its targets.
    mode="diagnose" records results but never moves the bounds (vanilla FP8).
    New bounds apply from the next step. `from_config` builds one from a config section.
    The run's plan rides along, never checkpointed (RUN_FIELDS): whether the run has shadow
    steps at all, whether a shadow step feeds the state (`refits`; False: diagnostics only)
    and the relaxed bound source's fixed lower bound.
    `level` says what the observed ratios are: tokens', or responses' (GSPO's sequence ratios,
    one per row; the counts min_tokens, pool_min_clips, pool_max_tokens then count responses).
    """

    lower: float
    upper: float
    nominal: tuple[float, float] | None = None
    interval: int = 20
    mode: CalibrationMode = CalibrationMode.CALIBRATE
    history: list[dict] = field(default_factory=list)
    max_step: tuple[float, float] = (0.05, 0.1)
    min_tokens: int = 32
    upper_max: float | None = None
    lower_min: float = 0.05
    rule: str = "pooled"
    shadow_every: int | None = None
    pool_window: int = 5
    pool_min_clips: int = 20
    pool_max_tokens: int = 1 << 22
    seed: int = 0
    level: RatioLevel = RatioLevel.TOKEN
    shadow_passes: bool = True  # False: the run has no shadow steps
    refits: bool = True  # False: a shadow step gives diagnostics only (no pool, no refit)
    relaxed_lower: float | None = None  # the relaxed bound source's fixed L; None: nominal
    # per shadow step: {"step": int, "ratio", "ratio_ref", "adv": flat tensors of N and P};
    # "ratio_ref" holds the shadow ratios under the tensor name checkpoints have always saved
    pool: deque = field(default_factory=deque, repr=False, compare=False)

    def __post_init__(self):
        self.lower, self.upper = check_bounds("bounds (lower, upper)", (self.lower, self.upper))
        if self.nominal is None:
            self.nominal = (self.lower, self.upper)
        self.nominal = check_bounds("nominal", self.nominal)
        _positive_int("interval", self.interval)
        if self.shadow_every is None:
            self.shadow_every = self.interval
        _positive_int("shadow_every", self.shadow_every)
        if self.interval % self.shadow_every:
            raise ValueError(
                f"interval ({self.interval}) must be a multiple of shadow_every "
                f"({self.shadow_every}): bounds are refit at shadow steps"
            )
        self.mode = as_member(CalibrationMode, self.mode, "calibration mode")
        self.level = as_member(RatioLevel, self.level, "ratio level")
        check_rule(self.rule)
        for name in ("pool_window", "pool_min_clips", "pool_max_tokens", "min_tokens"):
            _positive_int(name, getattr(self, name))
        self.max_step = pair("max_step", self.max_step)
        self.pool = deque(self.pool, maxlen=self.pool_window)

    @classmethod
    def from_config(
        cls,
        section,
        *,
        eps: tuple[float, float],
        source: BoundSource | str,
        level: RatioLevel | str = RatioLevel.TOKEN,
        relaxed_lower: float | None = None,
        shadow_passes: bool = True,
        seed: int = 0,
    ) -> CalibrationState:
        """A state at the nominal bounds (1 - eps_low, 1 + eps_high) of `eps` with the settings
        of a calibration config section (duck-typed: the fields of SECTION_FIELDS plus
        max_step_lower, max_step_upper). The loss mode's bound `source` sets the mode and
        whether shadow steps feed the state: only `calibrated` refits and moves the bounds;
        `relaxed` clips at `relaxed_lower`; its ratio `level` sets the caps (`level_caps`).
        `shadow_passes`: does the run have shadow steps. Every setting is kept, so checkpoints
        record the settings the run used (the caps as scaled)."""
        nominal = (1 - eps[0], 1 + eps[1])
        caps = (section.max_step_lower, section.max_step_upper)
        mode = CalibrationMode.for_source(source)
        relaxed = as_member(BoundSource, source, "bound source") is BoundSource.RELAXED
        return cls(
            lower=nominal[0],
            upper=nominal[1],
            nominal=nominal,
            mode=mode,
            max_step=level_caps(caps, nominal, level),
            seed=seed,
            level=level,
            shadow_passes=shadow_passes,
            refits=mode is CalibrationMode.CALIBRATE,
            relaxed_lower=relaxed_lower if relaxed else None,
            **{name: getattr(section, name) for name in SECTION_FIELDS},
        )

    @property
    def bounds(self) -> tuple[float, float]:
        return self.lower, self.upper

    @property
    def moves_bounds(self) -> bool:
        """Does a refit move the bounds (mode calibrate), or is it only recorded?"""
        return self.mode is CalibrationMode.CALIBRATE

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """The (lower, upper) a step's loss clips at: the refit bounds where they move, else
        the nominal ones (the relaxed source: its fixed lower bound). Read once per step,
        before the shadow phase moves the calibrated ones."""
        if self.moves_bounds:
            return self.bounds
        lower = self.nominal[0] if self.relaxed_lower is None else self.relaxed_lower
        return lower, self.nominal[1]

    def is_shadow_step(self, step: int) -> bool:
        """Do the two BF16 shadow passes (and the shadow phase) run at this step?"""
        return self.shadow_passes and step >= 0 and step % self.shadow_every == 0

    @property
    def rule_row(self) -> CalibrationRule:
        return RULES[self.rule]

    def is_refit_step(self, step: int) -> bool:
        return step >= self.rule_row.first_step and step % self.interval == 0

    def observe(self, step: int, ratio, ratio_shadow, advantages, mask) -> CalibrationResult | None:
        """A shadow step's FP8 ratios, BF16 shadow ratios, advantages and mask (the whole
        global batch). Pools them where the rule does and refits at refit steps: returns the
        CalibrationResult then (recorded, adopted in mode "calibrate"), else None."""
        check_same_shape("ratio", ratio, ratio_shadow=ratio_shadow, mask=mask)
        row = self.rule_row
        if row.pools and step >= row.first_step:
            self._add_to_pool(step, ratio, ratio_shadow, advantages, mask)
        if not self.is_refit_step(step):
            return None
        if not row.pools:
            return self.calibrate(ratio, ratio_shadow, advantages, mask, step=step)
        r, rh, adv, n_steps = self._pooled(step)
        result = self._fit(r, rh, adv, torch.ones_like(r, dtype=torch.bool))
        result = dataclasses.replace(
            result, pool_steps=n_steps, reason=result.reason if n_steps else "the pool is empty"
        )
        self.update(result, step=step)
        return result

    def _add_to_pool(self, step: int, ratio, ratio_shadow, advantages, mask) -> None:
        m = as_bool_mask(mask)
        adv = broadcast_advantages(advantages.detach(), ratio, "ratio")
        keep = m & (adv != 0)  # N and P; zero-advantage tokens never matter
        self.pool.appendleft(
            {
                "step": int(step),
                "ratio": ratio.detach()[keep],
                "ratio_ref": ratio_shadow.detach()[keep],
                "adv": adv[keep],
            }
        )

    def _pooled(self, step: int):
        """The refit step's own entry first, then older ones, until pool_min_clips BF16
        lower clips or pool_window steps; subsampled (oldest first) to pool_max_tokens."""
        entries = list(self.pool)
        if not entries:
            empty = torch.zeros(0, dtype=torch.float64)
            return empty, empty, empty, 0
        l0 = self.nominal[0]
        clips = torch.stack(
            [((e["adv"] < 0) & (e["ratio_ref"] < l0)).sum() for e in entries]
        ).tolist()
        chosen, total = [], 0
        for e, k in zip(entries, clips, strict=True):
            chosen.append(e)
            total += k
            if total >= self.pool_min_clips:
                break
        sizes, budget, parts = [e["ratio"].numel() for e in chosen], self.pool_max_tokens, []
        gen = None
        # newest first: the oldest lose tokens first
        for e, size in zip(chosen, sizes, strict=True):
            if budget <= 0:
                break
            if size > budget:
                if gen is None:
                    gen = torch.Generator().manual_seed(
                        zlib.crc32(f"{self.seed}/{step}/pool".encode())
                    )
                idx = (
                    torch.randperm(size, generator=gen)[:budget].sort().values.to(e["ratio"].device)
                )
                e = {k: (v[idx] if torch.is_tensor(v) else v) for k, v in e.items()}
                size = budget
            parts.append(e)
            budget -= size
        cat = [
            torch.cat([p[k].to(torch.float64) for p in parts])
            for k in ("ratio", "ratio_ref", "adv")
        ]
        return (*cat, len(chosen))

    def calibrate(
        self, ratio, ratio_shadow, advantages, mask, *, step: int | None = None
    ) -> CalibrationResult:
        """calibrate_bounds on exactly these tokens with this state's bounds, rule and
        settings (no pool), then update()."""
        result = self._fit(ratio, ratio_shadow, advantages, mask)
        self.update(result, step=step)
        return result

    def _fit(self, ratio, ratio_shadow, advantages, mask) -> CalibrationResult:
        """calibrate_bounds with this state's bounds, rule and settings; no caps for a rule
        whose first refit is uncapped until one has moved the bounds."""
        uncapped = self.rule_row.uncapped_first_refit and not any(
            h.get("updated") for h in self.history
        )
        return calibrate_bounds(
            ratio,
            ratio_shadow,
            advantages,
            mask,
            nominal=self.nominal,
            previous=self.bounds,
            rule=self.rule,
            max_step=None if uncapped else self.max_step,
            min_tokens=self.min_tokens,
            upper_max=self.upper_max,
            lower_min=self.lower_min,
        )

    def update(self, result: CalibrationResult, *, step: int | None = None) -> None:
        if not isinstance(result, CalibrationResult):
            raise ValueError(f"result must be a CalibrationResult, got {type(result).__name__}")
        entry = result.as_dict()
        entry["step"] = step
        entry["mode"] = self.mode.value
        self.history.append(entry)
        if self.moves_bounds and result.updated:
            self.lower, self.upper = result.lower, result.upper

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """JSON-serialisable (lists, not tuples; no NaN). The pool is in pool_tensors()."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _SAVED}
        out["nominal"], out["max_step"] = list(self.nominal), list(self.max_step)
        out["mode"] = self.mode.value  # a plain string, as in checkpoints before the enum
        out["level"] = self.level.value  # checkpoints without it are token level (the default)
        out["history"] = [dict(h) for h in self.history]
        out["pool_steps_held"] = [e["step"] for e in self.pool]
        return out

    def load_state_dict(self, state: dict) -> None:
        names = [f.name for f in fields(self) if f.name in _SAVED]
        unknown = sorted(set(state) - set(names) - {"pool_steps_held"})
        missing = sorted({"lower", "upper", "nominal"} - set(state))
        if unknown or missing:
            raise ValueError(
                f"CalibrationState.load_state_dict: unknown keys {unknown}, missing keys {missing}"
            )
        kwargs = {k: state[k] for k in names if k in state}
        kwargs["nominal"] = tuple(kwargs["nominal"])
        if "max_step" in kwargs:
            kwargs["max_step"] = tuple(kwargs["max_step"])
        kwargs["history"] = [dict(h) for h in kwargs.get("history", [])]
        kwargs.update({name: getattr(self, name) for name in RUN_FIELDS})  # this run's plan
        fresh = CalibrationState(**kwargs)  # validates
        for name in names + ["pool"]:
            setattr(self, name, getattr(fresh, name))

    def pool_tensors(self) -> dict[str, torch.Tensor]:
        """The pool as flat CPU tensors, newest step first: for a safetensors file."""
        out = {}
        for i, e in enumerate(self.pool):
            out[f"{i}.step"] = torch.tensor([e["step"]], dtype=torch.int64)
            for k in ("ratio", "ratio_ref", "adv"):
                out[f"{i}.{k}"] = e[k].detach().contiguous().cpu()
        return out

    def load_pool_tensors(self, tensors: dict[str, torch.Tensor], device=None) -> None:
        n = len({k.split(".", 1)[0] for k in tensors})
        try:
            entries = [
                {
                    "step": int(tensors[f"{i}.step"][0]),
                    **{k: tensors[f"{i}.{k}"].to(device) for k in ("ratio", "ratio_ref", "adv")},
                }
                for i in range(n)
            ]
        except KeyError as e:
            raise ValueError(f"CalibrationState.load_pool_tensors: missing tensor {e}") from None
        self.pool = deque(entries, maxlen=self.pool_window)


# what a checkpoint holds of a state: not its pool (pool_tensors) nor the run's plan (RUN_FIELDS)
_SAVED = frozenset(f.name for f in fields(CalibrationState)) - {"pool", *RUN_FIELDS}
