"""The loss-mode table is the one source: config validation, the step and docs/rl.md agree
with it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from fp8rl.config import LossConfig, config_from_dict
from fp8rl.errors import ConfigError
from fp8rl.rl.loss_modes import LOSS_MODES, BoundSource, LossMode, RatioLevel
from fp8rl.rl.losses import POLICY_LOSSES

DOC = Path(__file__).resolve().parent.parent / "docs" / "rl.md"


def test_every_mode_names_a_registered_loss_and_real_config_fields():
    fields = {f.name for f in dataclasses.fields(LossConfig)}
    for name, mode in LOSS_MODES.items():
        assert mode.name == name and mode.loss in POLICY_LOSSES, name
        assert isinstance(mode.bounds, BoundSource), name
        assert all(field in fields for _, field in mode.options), name


def test_one_clipped_surrogate_serves_every_bound_source():
    ppo = {m.bounds for m in LOSS_MODES.values() if m.loss == "ppo_clip"}
    assert ppo == set(BoundSource)
    assert not {"relax_lower", "calibrated", "gspo_calibrated"} & set(POLICY_LOSSES)
    moving = [m.name for m in LOSS_MODES.values() if m.moves_bounds]
    assert moving == ["calibrated", "gspo_calibrated"]


def test_the_sequence_level_is_gspo_s_and_both_its_modes_share_its_range():
    seq = {m.name for m in LOSS_MODES.values() if m.level is RatioLevel.SEQUENCE}
    assert seq == {m.name for m in LOSS_MODES.values() if m.loss == "gspo"}
    assert seq == {"gspo", "gspo_calibrated"}
    gspo, calibrated = LOSS_MODES["gspo"], LOSS_MODES["gspo_calibrated"]
    assert (gspo.eps_low, gspo.eps_high, gspo.agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert (calibrated.eps_low, calibrated.eps_high) == (gspo.eps_low, gspo.eps_high)
    assert (gspo.bounds, calibrated.bounds) == (BoundSource.NOMINAL, BoundSource.CALIBRATED)


def test_an_unknown_bound_source_or_level_names_every_allowed_one():
    with pytest.raises(ValueError, match="unknown bound source 'fixed'; valid: nominal, relaxed"):
        LossMode("m", "ppo_clip", bounds="fixed")
    with pytest.raises(ValueError, match="unknown ratio level 'batch'; valid: token, sequence"):
        LossMode("m", "ppo_clip", level="batch")


def _doc_rows() -> dict[str, list[str]]:
    text = DOC.read_text()
    section = text[text.index("## Loss modes") :]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z_]+)`", cells[0]) if line.startswith("|") else None
        if m and len(cells) == 5:  # a row of the modes table (a doc-only mode shows up too)
            rows[m.group(1)] = cells
    return rows


def test_docs_list_every_mode_with_its_loss_and_default_aggregation():
    rows = _doc_rows()
    assert set(rows) == set(LOSS_MODES)
    for name, cells in rows.items():
        mode = LOSS_MODES[name]
        assert cells[1] == f"`{mode.loss}`", name
        assert cells[3] == f"`{mode.agg}`", name


@pytest.mark.parametrize("name", sorted(LOSS_MODES))
def test_config_defaults_come_from_the_table(name):
    cfg = config_from_dict({"loss": {"mode": name}})
    mode = LOSS_MODES[name]
    assert cfg.loss.resolved_eps() == (mode.eps_low, mode.eps_high)
    assert cfg.loss.resolved_agg() == mode.agg
    assert cfg.loss.resolved_dynamic_sampling() is mode.dynamic_sampling


def test_an_unknown_mode_names_every_allowed_one():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"loss": {"mode": "ppo"}})
    assert "loss.mode" in str(e.value) and all(m in str(e.value) for m in LOSS_MODES)
