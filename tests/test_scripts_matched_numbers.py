"""scripts/matched_numbers.py: Fisher's exact test by hand, and the committed numbers behind
docs/study-matched.md's corrected prose recompute from the committed runs."""

import json
import math
from pathlib import Path

import pytest

from helpers_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
mn = load_script("matched_numbers")


def test_fisher_two_sided_by_hand():
    # [[4, 6], [1, 19]]: margins 10 and 5 of 30; P(x) = C(5, x) C(25, 10 - x) / C(30, 10), and
    # only x = 4 (885500) and x = 5 (53130) are no more likely than the observed x = 4
    assert mn.fisher_two_sided(4, 6, 1, 19) == pytest.approx((885500 + 53130) / 30045015)
    # a table at its most likely point: every table counts, p = 1
    assert mn.fisher_two_sided(1, 1, 1, 1) == pytest.approx(1.0)
    # the tea-tasting table [[3, 1], [1, 3]]: (1 + 16 + 16 + 1) / 70
    assert mn.fisher_two_sided(3, 1, 1, 3) == pytest.approx(34 / 70)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def test_the_committed_numbers_recompute_from_the_committed_runs():
    committed = json.loads((mn.MATCHED / "numbers.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(mn.compute()))  # tuples as lists, as written
    assert _close(fresh, committed)
    assert (mn.MATCHED / "numbers.md").read_text(encoding="utf-8") == mn.to_md(fresh) + "\n"
    # the figures the doc quotes
    assert committed["degradations"]["cc"] == [4, 10]
    assert committed["degradations"]["others"] == [1, 20]
    assert (
        round(committed["removed_last_50"]["reward"]["share_removed"]["matched-calibrated"], 2)
        == 0.19
    )
