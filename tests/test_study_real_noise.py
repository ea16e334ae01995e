"""The real-model noise probe (study/real_noise.py) on a tiny Llama: its hooks against
transformers' own hidden states, its NMAE against float64 by hand, its per-layer switching
against the conversion's report, the protocol's selection rule on hand-made rows."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

from fp8rl.config.precision import prepare_model
from fp8rl.fp8 import KeepHighPrecision
from fp8rl.fp8.convert import named_fp8_linears
from fp8rl.fp8.keep import decoder_blocks
from fp8rl.models.tiny import tiny_model
from fp8rl.rollout import RolloutEngine, SamplingParams
from fp8rl.study import real_noise as rn
from fp8rl.study.real_noise_table import _extra_share, bands, selection
from fp8rl.study.run_checks import IncompleteRunsError

N_BLOCKS = 4


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(
        "llama", num_hidden_layers=N_BLOCKS, hidden_size=64, intermediate_size=128, seed=3
    ).eval()
    engine = RolloutEngine(model)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    # equal prompt lengths: no left padding, so plain positions match the engine's
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    batch = engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
    blocks = decoder_blocks(model)
    return model, batch, blocks, rn.forward(model, batch, blocks)


def test_block_outputs_are_transformers_hidden_states(setup):
    model, batch, blocks, ref = setup
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask], 1).long()
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    t, m = batch.response_ids.shape[1], batch.response_mask
    assert len(ref["hidden"]) == N_BLOCKS
    # hidden_states[k + 1] is block k's output, but the last one is after the final norm
    for k in range(N_BLOCKS - 1):
        torch.testing.assert_close(ref["hidden"][k][m], hs[k + 1][:, -t:][m], atol=1e-5, rtol=1e-5)


def test_nmae_and_bands_against_float64_by_hand():
    g = torch.Generator().manual_seed(1)
    lp_ref = -torch.rand(3, 5, generator=g) * 4
    lp = lp_ref + 0.1 * torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    p, q = lp.double().exp(), lp_ref.double().exp()
    want = sum(abs(p[i, j] - q[i, j]) for i, j in mask.nonzero().tolist()) / sum(
        q[i, j] for i, j in mask.nonzero().tolist()
    )
    assert rn.nmae(lp, lp_ref, mask) == pytest.approx(float(want), rel=1e-12)
    ref = {"lp": lp_ref, "entropy": torch.rand(3, 5, generator=g) * 2}
    got = rn.banded(lp, ref, mask, "prob", rn.PROB_BANDS)
    assert sum(b["tokens"] for b in got) == int(mask.sum())  # the bands partition the tokens
    for b in got:
        lo, hi = b["band"]
        sub = mask & (q >= lo) & (q < hi)
        assert b["tokens"] == int(sub.sum())
        if b["tokens"]:
            assert b["nmae"] == pytest.approx(rn.nmae(lp, lp_ref, sub))
    ent = rn.banded(lp, ref, mask, "entropy", rn.ENTROPY_BANDS)
    assert sum(b["tokens"] for b in ent) == int(mask.sum())


def test_everything_kept_is_the_reference_exactly(setup):
    model, batch, blocks, ref = setup
    q = rn.quantized_copy(model, "fp8-rowwise")
    rn.apply_keep(q, "fp8-rowwise", KeepHighPrecision(first_blocks=N_BLOCKS), blocks)
    got = rn.forward(q, batch, blocks)
    assert torch.equal(got["lp"], ref["lp"])
    assert rn.hidden_errors(got["hidden"], ref["hidden"], batch.response_mask) == [0.0] * N_BLOCKS


@pytest.mark.parametrize("k", [0, 2, N_BLOCKS - 1])
def test_one_block_quantized_is_that_block_alone(setup, k):
    model, batch, blocks, ref = setup
    q = rn.quantized_copy(model, "fp8-rowwise")
    rn.apply_keep(q, "fp8-rowwise", rn.only_block(k, N_BLOCKS), blocks)
    in_fp8 = {name for name, layer in named_fp8_linears(q) if layer.recipe is not None}
    assert in_fp8 and all(re.match(rf"model\.layers\.{k}\.", n) for n in in_fp8)
    assert len(in_fp8) == 7  # q, k, v, o, gate, up, down
    err = rn.hidden_errors(
        rn.forward(q, batch, blocks)["hidden"], ref["hidden"], batch.response_mask
    )
    assert err[:k] == [0.0] * k and err[k] > 0  # the error enters at block k


@pytest.mark.parametrize(
    "keep",
    [
        KeepHighPrecision(),
        KeepHighPrecision(lm_head=False),
        KeepHighPrecision(first_blocks=1, last_blocks=1),
        KeepHighPrecision(down_proj=True),
        KeepHighPrecision(modules=("model.layers.2.*",)),
    ],
)
def test_coverage_is_the_conversion_reports(setup, keep):
    model, _, blocks, _ = setup
    report = prepare_model(copy.deepcopy(model), "fp8-rowwise", "fp8-rowwise", keep)
    assert rn.coverage(model, keep, blocks) == pytest.approx(report.coverage, rel=1e-12)


def test_switching_equals_converting(setup):
    """A kept layer switched off in the all-FP8 copy computes as a run converted with `keep`."""
    model, batch, blocks, _ = setup
    keep = KeepHighPrecision(down_proj=True, last_blocks=1)
    q = rn.quantized_copy(model, "fp8-rowwise")
    rn.apply_keep(q, "fp8-rowwise", keep, blocks)
    converted = copy.deepcopy(model)
    prepare_model(converted, "fp8-rowwise", "fp8-rowwise", keep)
    torch.testing.assert_close(
        rn.forward(q, batch, blocks)["lp"], rn.forward(converted, batch, blocks)["lp"]
    )


def test_the_protocols_rule_on_hand_rows():
    rows = [
        {"name": "a", "nmae": 0.09, "coverage": 0.79},
        {"name": "b", "nmae": 0.025, "coverage": 0.6},
        {"name": "c", "nmae": 0.02, "coverage": 0.4},
    ]
    got = rn.choose(rows)
    assert got["name"] == "b" and got["target_reached"]  # under 3 %, the most FP8 left
    rows[1]["nmae"], rows[2]["nmae"] = 0.05, 0.04
    got = rn.choose(rows)  # none under 3 %: the lowest NMAE keeping at least half in FP8
    assert got["name"] == "b" and not got["target_reached"]


def test_candidates_name_the_worst_blocks(setup):
    _, _, blocks, _ = setup
    c = rn.candidates([3, 1, 0, 2], blocks)
    assert c["worst 2 blocks [1, 3]"].modules == ("model.layers.1.*", "model.layers.3.*")
    assert c["down_proj of worst 1 [3]"].modules == ("model.layers.3.*down_proj",)
    assert c["default (lm_head)"] == KeepHighPrecision()


def test_extra_share_needs_extra_clips():
    per = {
        "shadow/clipfrac_lower_neg_fp8": [0.03, 0.01, None],
        "shadow/clipfrac_lower_neg_bf16": [0.01, 0.01, 0.0],
        "shadow/clipfrac_fp8": [0.05, 0.02, 0.01],
        "shadow/clipfrac_bf16": [0.01, 0.02, 0.0],
    }
    assert _extra_share(per) == [pytest.approx(0.5), None, None]


def test_tables_refuse_missing_outputs(tmp_path):
    with pytest.raises(IncompleteRunsError, match="selection.json"):
        rn.tables(tmp_path)


def test_selection_and_band_tables_from_hand_data():
    sel = {
        "seeds": [100, 101],
        "precision": "fp8-rowwise",
        "tokens": [10, 12],
        "rows": [
            {"name": "default (lm_head)", "nmae": 0.09, "coverage": 0.79},
            {"name": "down_proj", "nmae": 0.04, "coverage": 0.59},
        ],
        "chosen": {"name": "down_proj", "target_reached": False},
    }
    text = selection(sel)
    assert "| down_proj **(chosen)** | 4.00 | 59.00 |" in text
    assert "not reached" in text
    seed = {
        "tokens": 4,
        "nmae": 0.1,
        "by_prob": [{"band": [0.0, 0.5], "tokens": 1, "nmae": 0.2}],
        "by_entropy": [{"band": [0.0, 1.0], "tokens": 3, "nmae": 0.05}],
    }
    other = {**seed, "nmae": 0.3}
    text = bands({"cells": {"fp8-rowwise/default": [seed, other]}})
    assert "| fp8-rowwise | default | 20.00 ± 10.00 | 20.00 ± 0.00 | 5.00 ± 0.00 |" in text
    assert text.endswith("| tokens, all seeds | | 8 | 2 | 6 |")


def test_the_docs_tables_recompute_from_the_committed_outputs():
    """Every line of the tables in docs/real-model.md, "FP8 noise on the real model", is what
    the committed probes and sweeps give now."""
    root = Path(__file__).resolve().parents[1]
    text = rn.tables(root / "docs" / "real-model" / "noise")
    doc = (root / "docs" / "real-model.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) > 40
    missing = [line for line in lines if line not in doc]
    assert not missing, "stale lines in docs/real-model.md:\n" + "\n".join(missing)
