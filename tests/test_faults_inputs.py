"""Issue 13, part B: hostile responses, non-finite values and bad inputs.

Each test feeds one fault and checks what the docs (docs/reliability.md, "Bad input and
non-finite values") promise: a bounded reward, a skipped update, or a one-line error.
"""

import time

import pytest
import torch

from fp8rl.tasks import MathTask, Sample
from fp8rl.tasks.grading import grade_strings
from helpers_config import tiny_config_file

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

    from fp8rl.config import config_from_dict
    from fp8rl.step import update as step_mod
    from fp8rl.train.trainer import Trainer
    from helpers_config import tiny_config
    from helpers_step import parity_reward

    poisoned_updates = {1, 2}  # of 4 (2 steps x 2 mini-batches): after real AdamW moments exist
    state = {"update": -1, "on": False, "checked": 0, "moved": 0}

    real_update = step_mod.update_minibatch

    def watched_update(ctx, data, mb, *args, **kw):
        state["update"] += 1
        state["on"] = state["update"] in poisoned_updates
        if poison == "advantages" and state["on"]:
            data.advantages[mb.rows] = float("nan")
        before = _snapshot(ctx)
        out = real_update(ctx, data, mb, *args, **kw)
        after = _snapshot(ctx)
        state["on"] = False
        if out.skipped:
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

    cfg = config_from_dict(
        tiny_config(
            tmp_path,
            train={
                "steps": 2,
                "mini_batches": 2,
                "precision": precision,
                "fp8_check_finite": check,
            },
            rollout={"precision": "bf16"},
        )
    )
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
    events = [
        line
        for line in (tmp_path / "events.log").read_text().splitlines()
        if "update skipped" in line
    ]
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


# ---------------------------------------------------------------------------------------
# Item 5: every bad input is a one-line error naming the key or file, before any run folder.


def _weights(tmp_path, kind: str):
    """A weights file for the tiny model: not safetensors at all, or real ones with a nan."""
    path = tmp_path / f"{kind}.safetensors"
    if kind == "garbage":
        path.write_bytes(b"this is not a safetensors file\n" * 4)
    else:
        from safetensors.torch import save_file

        save_file({"model.embed_tokens.weight": torch.tensor([[1.0, float("nan")]])}, str(path))
    return path


def _cli(d, command: str, *args) -> list[str]:
    """`fp8rl COMMAND --config TINY ARGS...` on the tiny run's config file under d."""
    return [command, "--config", str(tiny_config_file(d)), *args]


# (id, command builder, needles the error line must hold)
CLI_CASES = {
    "empty_yaml": (
        lambda d: ["train", "--config", _text(d, "empty.yaml", "")],
        ["--config", "empty.yaml", "a mapping", "empty file"],
    ),
    "list_yaml": (
        lambda d: ["train", "--config", _text(d, "list.yaml", "- a\n- b\n")],
        ["list.yaml", "a mapping", "YAML list"],
    ),
    "string_yaml": (
        lambda d: ["train", "--config", _text(d, "str.yaml", "just words\n")],
        ["str.yaml", "a mapping", "YAML str"],
    ),
    "broken_yaml": (
        lambda d: ["train", "--config", _text(d, "bad.yaml", "train: [1,\n  lr: 2\n")],
        ["bad.yaml", "valid YAML", "line"],
    ),
    "betas_not_numbers": (
        lambda d: _cli(d, "train", "train.betas=[a,b]"),
        ["train.betas", "a list of numbers"],
    ),
    "negative_seed": (
        lambda d: _cli(d, "train", "train.seed=-1"),
        ["train.seed", "[0, "],
    ),
    "tiny_unknown_key": (
        lambda d: _cli(d, "train", "model.tiny.hiden_size=64"),
        ["model.tiny.hiden_size", "hidden_size"],
    ),
    "tiny_bad_value": (
        lambda d: _cli(d, "train", "model.tiny.num_hidden_layers=x"),
        ["model.tiny.num_hidden_layers", "an integer >= 1"],
    ),
    "init_weights_not_safetensors": (
        lambda d: _cli(d, "train", f"model.init_weights={_weights(d, 'garbage')}"),
        ["model.init_weights", "garbage.safetensors", "not a readable safetensors file"],
    ),
    "init_weights_nan": (
        lambda d: _cli(d, "train", f"model.init_weights={_weights(d, 'nan')}"),
        ["nan.safetensors", "model.embed_tokens.weight", "inf or nan"],
    ),
    "init_weights_missing": (
        lambda d: _cli(d, "train", f"model.init_weights={d / 'nope.safetensors'}"),
        ["model.init_weights", "nope.safetensors", "an existing"],
    ),
    "diagnose_steps_0": (
        lambda d: _cli(d, "diagnose", "--steps", "0"),
        ["--steps", "0", ">= 1"],
    ),
    "eval_limit_negative": (
        lambda d: _cli(d, "eval", "--limit", "-1"),
        ["--limit", "-1", ">= 1"],
    ),
    "eval_k_0": (
        lambda d: _cli(d, "eval", "--k", "0"),
        ["--k", ">= 1"],
    ),
}


def _text(d, name: str, content: str) -> str:
    (d / name).write_text(content)
    return str(d / name)


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(tmp_path, monkeypatch, capsys, case):
    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FP8RL_SCRATCH", raising=False)
    build, needles = CLI_CASES[case]
    argv = build(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fp8rl {argv[0]}: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    # validation came first: no run folder, no runs/.scratch, nothing new in the cwd
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_debug_flag_shows_the_traceback(tmp_path):
    from fp8rl.cli import main
    from fp8rl.errors import ConfigError

    with pytest.raises(ConfigError, match="train.seed"):
        main(["--debug", "train", "--config", str(tiny_config_file(tmp_path)), "train.seed=-1"])
    assert not (tmp_path / "run").exists()


def test_non_utf8_byte_in_a_math_file_names_file_and_line(tmp_path):
    from fp8rl.errors import DataError
    from fp8rl.tasks.math_data import read_math_rows

    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "x\xff", "answer": "3"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: line 2: not UTF-8 text \(byte 0xff"):
        read_math_rows(jsonl)
    js = tmp_path / "bad.json"
    js.write_bytes(b'[{"problem": "1+1",\n "answer": "2\xfe"}]')
    with pytest.raises(DataError, match=r"bad\.json: line 2: not UTF-8 text \(byte 0xfe"):
        read_math_rows(js)


@pytest.mark.parametrize("gold", ["NaN", "Infinity", '"nan"'])
def test_non_finite_gold_answer_is_rejected_naming_file_and_line(tmp_path, gold):
    from fp8rl.errors import DataError
    from fp8rl.tasks.math_data import read_math_rows

    path = tmp_path / "gold.jsonl"
    path.write_text(
        '{"problem": "1+1", "answer": "2"}\n' + '{"problem": "2+2", "answer": ' + gold + "}\n"
    )
    with pytest.raises(
        DataError, match=r"gold\.jsonl: line 2: field 'answer' is .*a gold answer must"
    ):
        read_math_rows(path)


def test_diagnose_writes_null_not_nan_and_eval_leaves_the_cwd_alone(tmp_path, monkeypatch, capsys):
    import json

    import fp8rl.study.diagnose as diagnose_mod
    from fp8rl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FP8RL_SCRATCH", raising=False)
    cfg = tiny_config_file(tmp_path)
    scratch = {}

    def fake_diagnose(trainer, steps):
        scratch["dir"] = trainer.run_dir
        assert trainer.run_dir.is_dir()
        return {"shadow/nmae_prob": float("nan"), "shadow/amplification": float("inf"), "ok": 0.5}

    monkeypatch.setattr(diagnose_mod, "diagnose", fake_diagnose)
    assert main(["diagnose", "--config", str(cfg)]) == 0

    def strict(name):
        raise AssertionError(f"bare {name} in JSON output")

    out = json.loads(capsys.readouterr().out, parse_constant=strict)
    assert out == {"shadow/nmae_prob": None, "shadow/amplification": None, "ok": 0.5}
    assert not scratch["dir"].exists()  # the scratch folder was a temporary one
    assert main(["eval", "--config", str(cfg), "--limit", "1"]) == 0
    assert "eval/mean@1" in json.loads(capsys.readouterr().out, parse_constant=strict)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]  # no runs/.scratch


def test_a_bad_math_data_file_through_the_cli_touches_no_run_folder(tmp_path, monkeypatch, capsys):
    from fp8rl.cli import main
    from fp8rl.models import tiny_qwen3
    from fp8rl.tasks import char_tokenizer

    model_dir = tmp_path / "model"  # a local Hugging Face folder: the math task needs its tokenizer
    tok = char_tokenizer()
    tiny_qwen3(vocab_size=len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "x\xff", "answer": "3"}\n')
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # save_pretrained's own progress lines
    code = main(
        [
            "train",
            "--out",
            "runs/x",
            "--no-progress",
            f"model.source={model_dir}",
            "task.name=math",
            f"task.options.train_path={bad}",
            f"task.options.test_path={bad}",
            "train.steps=1",
        ]
    )
    err = capsys.readouterr().err
    # (transformers' own "Loading weights" progress lines may come first)
    ours = [line for line in err.splitlines() if line.startswith("fp8rl train: error:")]
    assert code == 2 and len(ours) == 1 and "bad.jsonl: line 2: not UTF-8" in ours[0], err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()
