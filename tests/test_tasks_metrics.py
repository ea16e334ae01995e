"""pass@k, mean@k and score_responses against hand values and brute-force enumeration."""

from fractions import Fraction
from itertools import combinations

import pytest

from fp8rl.tasks import ArithmeticTask, Sample, mean_at_k, pass_at_k, score_responses


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
        (10, 1, 10, 1.0),  # every draw of 10 includes the correct one
        (16, 1, 1, 1 / 16),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_equals_brute_force_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            items = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(combinations(range(n), k))
                hit = sum(any(items[i] for i in s) for s in subsets)
                assert pass_at_k(n, c, k) == pytest.approx(
                    float(Fraction(hit, len(subsets))), abs=1e-15
                )


def test_pass_at_k_large_n_is_exact_enough():
    # 1 - C(512-1, 256)/C(512, 256) = 1 - 256/512 exactly.
    assert pass_at_k(512, 1, 256) == 0.5


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers():
    with pytest.raises(TypeError):
        pass_at_k(4.0, 2, 1)


def test_mean_at_k():
    assert mean_at_k([[1, 0, 1, 1], [0, 0, 0, 1]]) == 0.5  # (3/4 + 1/4) / 2
    assert mean_at_k([[0.5]]) == 0.5
    with pytest.raises(ValueError, match="same number"):
        mean_at_k([[1, 0], [1]])
    with pytest.raises(ValueError, match="non-empty"):
        mean_at_k([])
    with pytest.raises(ValueError, match="matrix"):
        mean_at_k([1, 0, 1])


def test_score_responses_by_hand():
    task = ArithmeticTask(train_size=10, test_size=10)
    a = Sample(prompt="12+34=", answer="46", question="12+34")
    b = Sample(prompt="50+49=", answer="99", question="50+49")
    out = score_responses(task, [a, b], [["46", "47", "46<eos>", "x"], ["1", "2", "3", "4"]])
    assert out == {
        "mean@4": 0.25,  # (2/4 + 0/4) / 2
        "pass@1": 0.25,  # mean of c/n
        "pass@2": pytest.approx(5 / 12),  # (1 - C(2,2)/C(4,2) + 0) / 2 = (5/6) / 2
        "pass@4": 0.5,
        "parsed_frac": 7 / 8,  # "x" is not a number
        "num_prompts": 2,
        "num_responses": 8,
    }
    assert set(score_responses(task, [a], [["46"] * 6])) >= {
        "mean@6",
        "pass@1",
        "pass@2",
        "pass@4",
        "pass@6",
    }
    assert score_responses(task, [a], [["46", "1", "2"]], ks=[3])["pass@3"] == 1.0


def test_score_responses_rejects_ragged_input():
    task = ArithmeticTask(train_size=10, test_size=10)
    s = Sample(prompt="1+1=", answer="2")
    with pytest.raises(ValueError, match="sample 1 has 1 responses"):
        score_responses(task, [s, s], [["2", "2"], ["2"]])
    with pytest.raises(ValueError, match="2 samples"):
        score_responses(task, [s, s], [["2"]])
