"""A held-out evaluation file as `fp8rl eval --out` writes it, for the study tools' tests."""

import json


def write_eval(path, correct, k=8):
    """`correct[i]` of k samples right on problem i, under one fixed evaluation setting."""
    problems = [
        {"index": i, "question": f"q{i}", "answer": "1", "k": k, "correct": c}
        for i, c in enumerate(correct)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    setting = {"split": "test", "k": k, "limit": None, "temperature": 1.0, "seed": 0}
    path.write_text(json.dumps({**setting, "max_new_tokens": 48, "problems": problems}))
