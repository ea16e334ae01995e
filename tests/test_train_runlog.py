"""train/runlog.py: the entropy-surge detector that flags a step in the run log."""

import json

import pytest
import torch

from fp8rl.train.runlog import EntropySurgeDetector


def test_entropy_surge_detector():
    det = EntropySurgeDetector(factor=1.5, window=20, min_history=5)
    # Fewer than 5 earlier values: never a surge, however large.
    assert [det.update(s, e) for s, e in enumerate([1.0, 1.1, 0.9, 10.0])] == [False] * 4
    det = EntropySurgeDetector(factor=1.5, window=20, min_history=5)
    for s, e in enumerate([1.0, 1.1, 0.9, 1.0, 1.05]):
        assert not det.update(s, e)
    assert not det.update(5, 1.4)  # median 1.0: 1.4 < 1.5
    # History [1, 1.1, .9, 1, 1.05, 1.4]: median 1.025, 1.5 x = 1.5375 < 1.6.
    assert det.update(6, torch.tensor(1.6))
    assert det.update(7, float("nan"))
    assert det.surges == [6, 7] and det.first_surge == 6

    restored = EntropySurgeDetector()
    restored.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert restored.state_dict() == det.state_dict()
    assert restored.update(8, 1.0) == det.update(8, 1.0)


def test_entropy_surge_window_forgets_old_steps():
    det = EntropySurgeDetector(factor=1.5, window=3, min_history=3)
    for s, e in enumerate([1.0, 1.0, 1.0, 2.0, 2.0, 2.0]):
        det.update(s, e)
    # Step 3: 2 > 1.5 x median[1, 1, 1]; step 4: 2 > 1.5 x median[1, 1, 2] = 1.5;
    # step 5: median[1, 2, 2] = 2, no surge. Window now [2, 2, 2]: 2.9 < 3.0 is no
    # longer a surge against the old 1.0 level.
    assert det.surges == [3, 4]
    assert not det.update(6, 2.9)
    with pytest.raises(ValueError, match="min_history = 4 exceeds window = 3"):
        EntropySurgeDetector(window=3, min_history=4)


@pytest.mark.parametrize(
    "factor", [0, -1.0, float("inf"), float("nan"), True, "2", torch.tensor(2.0)]
)
def test_entropy_surge_factor_must_be_a_positive_finite_number(factor):
    with pytest.raises(ValueError, match="factor"):
        EntropySurgeDetector(factor=factor)
    assert EntropySurgeDetector(factor=2).factor == 2.0
