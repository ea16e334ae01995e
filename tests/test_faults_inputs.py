"""Issue 13, part B: hostile responses, non-finite values and bad inputs.

Each test feeds one fault and checks what the docs (docs/reliability.md, "Bad input and
non-finite values") promise: a bounded reward, a skipped update, or a one-line error.
"""

import time

import pytest
import torch

from fp8rl.tasks import MathTask, Sample
from fp8rl.tasks.grading import grade_strings

# ---------------------------------------------------------------------------------------
# Item 6: a response's reward is linear in its length and ends within 3 x timeout_s.

MB = 1 << 20


def _fill(unit: str, size: int = MB) -> str:
    return (unit * (size // len(unit) + 1))[:size]


ADVERSARIAL = {
    # (text, whether it states an answer at all)
    "unclosed_boxes": (_fill("\\boxed{"), False),
    "deep_nesting": ("\\boxed{" * 70000 + "3" + _fill("}", MB - 70000 * 7 - 1), True),
    "many_boxes": (_fill("\\boxed{12} "), True),
    "one_huge_box": ("\\boxed{" + _fill("1+", MB - 9) + "1}", True),
    "huge_braces": ("\\boxed{" + "{" * (MB // 2 - 8) + "}" * (MB // 2 - 8) + "}", True),
    "nested_fracs": ("\\boxed{" + "\\frac{1}{" * (MB // 10) + "2" + "}" * (MB // 10) + "}", True),
    "wrapped_phrase": ("Answer: " + "\\(" * (MB // 4) + "x" + "\\)" * (MB // 4), True),
    "unclosed_braces_only": (_fill("{"), False),
}

# Generous: the promise is 3 x timeout_s = 3 s; the rest is slack for a loaded machine. The
# quadratic extraction this replaced took 71 s on 20,000 unclosed boxes (140 kB).
BOUND_S = 15.0


@pytest.fixture(scope="module")
def fast_task():
    t = MathTask(timeout_s=1)
    yield t
    t.close()


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_one_megabyte_of_adversarial_text_is_scored_within_the_time_limit(fast_task, name):
    text, states_answer = ADVERSARIAL[name]
    assert len(text) >= MB - 16
    sample = Sample(prompt="p", answer="7")  # matches none of the texts
    t0 = time.monotonic()
    result = fast_task.reward(text, sample)
    elapsed = time.monotonic() - t0
    assert elapsed < BOUND_S, (name, elapsed)
    assert result.score == 0.0
    if not states_answer:
        assert result.info["extracted"] is None and result.info["timeout"] is False
    elif len(result.info["extracted"]) > 1000:
        # A huge extracted answer can only be cut off by the time limit.
        assert result.info["timeout"] is True, (name, result.info["extracted"][:40])


def test_deeply_nested_boxes_extract_the_innermost_and_grade_right(fast_task):
    text, _ = ADVERSARIAL["deep_nesting"]
    result = fast_task.reward(text, Sample(prompt="p", answer="3"))
    assert result.info["extracted"] == "3" and result.score == 1.0


def test_grading_total_budget_bounds_all_parses_and_comparisons():
    grade_strings("1", "1", timeout_s=1)  # import math-verify outside the timed part
    t0 = time.monotonic()
    g = grade_strings("3", "10^{10^{10}}", timeout_s=1, budget_s=0.5)  # under a whole second
    assert g.timeout is True and g.correct is False
    assert time.monotonic() - t0 < 0.5
    # The default budget, 3 x timeout_s, leaves ordinary answers alone.
    assert grade_strings("\\frac{3}{4}", "0.75", timeout_s=1).correct is True


def test_extraction_time_counts_against_the_budget(monkeypatch):
    import types

    import fp8rl.tasks.math_task as math_task

    clock = iter([0.0, 10.0])  # extraction "took" 10 s of a 3 s budget (math_task's clock only)
    monkeypatch.setattr(math_task, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    task = MathTask(timeout_s=1)
    result = task.reward("\\boxed{3}", Sample(prompt="p", answer="3"))
    assert result.score == 0.0 and result.info["timeout"] is True


# ---------------------------------------------------------------------------------------
# Item 4: a non-finite loss, gradient or FP8 input skips the update, with or without the
# finite check, in FP8 and in bf16; the weights and AdamW moments stay exactly as they were.


def _snapshot(trainer):
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    moments = {
        (i, k): v.detach().clone()
        for i, st in trainer.optimizer.state.items()
        for k, v in ((k, v) for k, v in st.items() if torch.is_tensor(v))
    }
    return weights, moments


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


POISONS = ["loss", "fp8_input", "advantages"]
# (train precision, fp8_check_finite)
PRECISIONS = [("fp8-rowwise", True), ("fp8-rowwise", False), ("bf16", True)]


@pytest.mark.parametrize("precision,check", PRECISIONS, ids=["fp8-check", "fp8-nocheck", "bf16"])
@pytest.mark.parametrize("poison", POISONS)
def test_non_finite_updates_are_skipped_and_leave_weights_and_moments_alone(
    tmp_path, monkeypatch, precision, check, poison
):
    import torch.nn as nn

    from fp8rl.train import step as step_mod
    from fp8rl.train.config import config_from_dict
    from fp8rl.train.trainer import Trainer
    from test_train_loop import parity_reward, tiny_config

    poisoned_updates = {1, 2}  # of 4 (2 steps x 2 mini-batches): after real AdamW moments exist
    state = {"update": -1, "on": False, "checked": 0, "moved": 0}

    real_update = step_mod.update_minibatch

    def watched_update(t, data, idx):
        state["update"] += 1
        state["on"] = state["update"] in poisoned_updates
        if poison == "advantages" and state["on"]:
            data.advantages[idx] = float("nan")
        before = _snapshot(t)
        out = real_update(t, data, idx)
        after = _snapshot(t)
        state["on"] = False
        if out[1]["train/skipped_update"]:
            assert _equal(before[0], after[0]) and _equal(before[1], after[1])
            state["checked"] += 1
        else:
            assert not _equal(before[0], after[0])  # a clean update really moves the weights
            state["moved"] += 1
        return out

    monkeypatch.setattr(step_mod, "update_minibatch", watched_update)
    if poison == "loss":
        real_loss = step_mod.policy_loss

        def nan_loss(*args, **kwargs):
            loss, metrics = real_loss(*args, **kwargs)
            return (loss * float("nan") if state["on"] else loss), metrics

        monkeypatch.setattr(step_mod, "policy_loss", nan_loss)

    cfg = config_from_dict(tiny_config(
        tmp_path, train={"steps": 2, "mini_batches": 2, "precision": precision,
                         "fp8_check_finite": check},
        rollout={"precision": "bf16"}))
    trainer = parity_reward(Trainer(cfg))
    if poison == "fp8_input":
        # the first decoder layer's attention q projection sees inf in its input, in the
        # training forward only (with grad), on the poisoned mini-batches
        layer = trainer.model.model.layers[0].self_attn.q_proj
        assert isinstance(layer, nn.Linear)
        real_forward = layer.forward

        def inf_input(x):
            if state["on"] and torch.is_grad_enabled():
                x = x.clone()
                x.view(-1)[0] = float("inf")
            return real_forward(x)

        monkeypatch.setattr(layer, "forward", inf_input)
    rows = trainer.fit()
    assert len(rows) == 2  # the run completed
    assert state["checked"] == 2 and state["moved"] == 2
    assert [r["train/skipped_updates"] for r in rows] == [1.0, 1.0]
    assert trainer.skipped_updates == 2
    events = [line for line in (tmp_path / "events.log").read_text().splitlines()
              if "update skipped" in line]
    assert len(events) == 2
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    if not check:
        assert all("cause not located (train.fp8_check_finite is off)" in e for e in events)
    elif poison == "fp8_input" and precision.startswith("fp8"):
        # located: the event names the layer and the tensor the quantizer found non-finite
        assert all("model.layers.0.self_attn.q_proj: Fp8Linear input" in e for e in events)
    else:
        assert all("non-finite gradients of" in e for e in events), events


def test_record_nonfinite_records_instead_of_raising():
    from fp8rl.fp8 import quantize, record_nonfinite

    x = torch.ones(4, 8)
    x[1, 2] = float("nan")
    with pytest.raises(FloatingPointError, match="probe"):
        quantize(x, "rowwise", name="probe")
    with record_nonfinite() as outer, record_nonfinite() as inner:
        q = quantize(x, "rowwise", name="probe")
    assert inner == ["probe (shape (4, 8))"] and outer == []
    assert not torch.isfinite(q.dequantize()).all()  # the nan flows on, so a loss sees it
