"""Helpers shared by several test files. A test file imports from here, never from another
test file (tests/test_test_hygiene.py checks it), so each test module can be read, run and
renamed on its own.

Keep the imports at the top to the standard library, pytest, torch, numpy and hypothesis:
this module is imported in the vLLM venv too (scripts/check-vllm.sh); fp8rl and the optional
peers (trl, datasets) are imported inside the helpers that need them."""

from __future__ import annotations

import importlib.util
import json
import math
import socket

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

F64 = torch.float64
NAN = float("nan")

# ---------------------------------------------------------------- a tiny training run

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}


def tiny_config(out_dir, **sections) -> dict:
    """The config data of a tiny 2-step fp8-rowwise GRPO run on one-digit addition; each
    keyword updates that section (a dict is merged into it, anything else replaces it)."""
    data = {
        "name": "t",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 64, "test_size": 16},
        },
        "model": {"source": "tiny", "tiny": dict(TINY)},
        "rollout": {"precision": "fp8-rowwise", "prompts_per_step": 4, "n": 4, "max_new_tokens": 4},
        "train": {"precision": "fp8-rowwise", "steps": 2, "lr": 1e-3, "mini_batches": 2},
        "loss": {"mode": "grpo"},
        "calibration": {"interval": 1, "min_tokens": 2},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 0, "eval_size": 8, "progress": False},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return data


def tiny_config_file(tmp_path, **sections):
    """tiny_config written to tmp_path/cfg.json, its run folder tmp_path/run."""
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(tiny_config(tmp_path / "run", **sections)))
    return path


def parity_reward(trainer):
    """A random tiny model never answers right; a reward on the text's parity gives every
    group mixed rewards, so advantages (and gradients) are non-zero."""
    from fp8rl.tasks import RewardResult

    trainer.task.reward = lambda text, sample: RewardResult(
        float(sum(map(ord, text)) % 2), {"parsed": True}
    )
    return trainer


# ---------------------------------------------------------------- warm starts

FAST_WARM_START = {
    "steps": 20,
    "batch_size": 16,
    "lr": 5e-3,
    "target_accuracy": 1.0,
    "check_every": 10,
}


def warm_start_config(tmp_path, **sections):
    """The tiny run's config with `model.warm_start: auto` and a short warm start."""
    from fp8rl.config import config_from_dict

    model = {**tiny_config(tmp_path)["model"], "warm_start": "auto", **sections.pop("model", {})}
    return config_from_dict(
        tiny_config(
            tmp_path,
            model=model,
            warm_start={**FAST_WARM_START, **sections.pop("warm_start", {})},
            **sections,
        )
    )


def counting_builds(monkeypatch):
    """The list every warm-start build from now on appends its key to."""
    from fp8rl.train import warmstart as ws

    calls = []
    real = ws.build_warm_start

    def counted(cfg, **kw):
        calls.append(ws.warm_start_key(cfg))
        return real(cfg, **kw)

    monkeypatch.setattr(ws, "build_warm_start", counted)
    return calls


# ---------------------------------------------------------------- checkpoints, run folders


def trained_model(seed=0):
    """A one-layer tiny Qwen3 and its AdamW after one step: an optimizer with moments."""
    from fp8rl.models import tiny_qwen3

    model = tiny_qwen3(num_hidden_layers=1, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return model, opt


def snapshot(folder):
    """Every file under `folder` with its bytes: 'nothing changed' means this is equal."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def one_error_line(capsys, needle):
    """The one `fp8rl train: error:` line on stderr, which names `needle`; no traceback."""
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("fp8rl train: error:")]
    assert len(errors) == 1 and needle in errors[0], err
    assert not any("Traceback" in ln for ln in err)
    return errors[0]


def sweep_spec(tmp_path, weights=None, **top) -> dict:
    """A 2-arm (bf16, fp8) x 2-seed sweep spec of 3-step tiny runs; `top` updates it."""
    base = tiny_config(tmp_path / "unused", train={"steps": 3})
    if weights:
        base["model"]["init_weights"] = str(weights)
    spec = {
        "base": base,
        "arms": {
            "bf16": {"rollout": {"precision": "bf16"}, "train": {"precision": "bf16"}},
            "fp8": {"calibration": {"diagnostics": True}},
        },
        "seeds": [0, 1],
    }
    spec.update(top)
    return spec


# ---------------------------------------------------------------- several processes

# The data-parallel tests' model: smaller than TINY, since each test runs it in 3 processes.
TINY_DP = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Integer counts, reduced as sums of integers: equal to the last bit.
EXACT = {
    "calib/n_neg",
    "calib/n_pos",
    "calib/k",
    "calib/pool_steps",
    "calib/pool_neg_tokens",
    "calib/updated",
    "train/updates",
    "train/skipped_updates",
    "train/skipped_updates_total",
    "train/shadow_step",
}
# Everything else is a mean (or a weighted sum) of per-token or per-row float32 values of
# order 1, and the per-token values differ by float32 rounding only: the two runs push other
# batch shapes through the kernels (a rank's 12 rows against 24, other micro-batches) and add
# the gradients up in another order. Measured over train.seed 0-7, calibrated and dapo: every
# log-prob within 1.5e-6, every metric within 4.8e-7 of the reference. ATOL keeps an 8x margin
# for machines whose kernels round differently, and scales with the metric's size
# (grad_norm, entropy are a few units). Relative tolerance would be wrong here: actor/loss
# and actor/pg_loss are sums of terms of both signs that cancel to ~1e-3, and their 7e-8 of
# rounding is 1.5e-4 of that. A wrong weight moves a metric by a share of the rows or tokens
# (test_unequal_token_counts_per_rank_...: 1e-2 and more), four orders above ATOL.
ATOL = 4e-6


def compare_rows(got, want):
    """Two runs' metrics rows agree step by step: EXACT keys to the last bit, the rest within
    ATOL (scaled by the metric's size); the same keys in both, `time/*` aside."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith("time/")}
        assert keys == {k for k in g if not k.startswith("time/")}
        for k in sorted(keys):
            if w[k] is None or isinstance(w[k], str) or k in EXACT:
                assert g[k] == w[k], (g["step"], k, g[k], w[k])
            else:
                tol = ATOL * max(1.0, abs(w[k]))
                assert abs(g[k] - w[k]) <= tol, (g["step"], k, g[k], w[k])


# ---------------------------------------------------------------- rl/ tensors by hand


def shadow_case():
    """Hand-derived tokens for the shadow metrics (tests/test_rl_shadow.py derives each
    metric from them): (log p, FP8 old log-prob, log phat, BF16 old log-prob, adv, mask)."""
    # BF16 old prob .5 everywhere; per token (phat, p, FP8 old prob q, A):
    #   t0 (.45, .35, .5, -1): rhat .9, r .7  -> FP8 lower clip only (a false lower clip)
    #   t1 (.35, .35, .5, -1): rhat .7, r .7  -> lower clip in both
    #   t2 (.50, .50, .4, +1): rhat 1., r 1.25 -> FP8 upper clip only
    #   t3 (.50, .50, .5, +1): both 1
    #   t4 (.42, .41, .5, -1): rhat .84, r .82 -> no clip
    #   t5 masked out, garbage everywhere.
    phat = [0.45, 0.35, 0.5, 0.5, 0.42, NAN]
    p = [0.35, 0.35, 0.5, 0.5, 0.41, NAN]
    q = [0.5, 0.5, 0.4, 0.5, 0.5, NAN]
    log = lambda xs: torch.log(torch.tensor(xs, dtype=F64))  # noqa: E731
    adv = torch.tensor([-1.0, -1, 1, 1, -1, NAN], dtype=F64)
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    return log(p), log(q), log(phat), log([0.5] * 6), adv, mask


WIDE = dict(max_step=(10.0, 100.0), upper_max=100.0)  # calibration caps that never bind


def hand_case():
    """Hand-derived tokens for Algorithm 1 (tests/test_rl_calibration.py derives the bounds):
    (r, rhat, adv, mask)."""
    # N (A = -1): r = .6 .7 .9 1.0 1.1, rhat = .75 .85 .95 1.0 1.05
    # P (A = +1): r = .9 1.1 1.3 1.5,   rhat = .95 1.05 1.15 1.25
    r = torch.tensor([0.6, 0.7, 0.9, 1.0, 1.1, 0.9, 1.1, 1.3, 1.5], dtype=F64)
    rh = torch.tensor([0.75, 0.85, 0.95, 1.0, 1.05, 0.95, 1.05, 1.15, 1.25], dtype=F64)
    adv = torch.tensor([-1.0] * 5 + [1.0] * 4, dtype=F64)
    return r, rh, adv, torch.ones(9, dtype=torch.bool)


@st.composite
def batches(draw, ties=True):
    """Pooled tokens of a step: rhat near 1 (a policy update), r = rhat times FP8-like noise,
    advantages of both signs away from 0, about 10 % padding."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(90, 400))
    drift = draw(st.floats(0.02, 0.3))
    noise = draw(st.floats(0.0, 0.3))
    tied = ties and draw(st.booleans())
    rng = np.random.default_rng(seed)
    rh = np.exp(drift * rng.standard_normal(n))
    if tied:  # many equal ratios, as bf16 ratios or r == 1 on a first mini-batch produce
        rh = np.round(rh, 2)
    r = rh * np.exp(noise * rng.standard_normal(n))
    adv = rng.choice([-1.0, 1.0], n) * rng.uniform(0.05, 3.0, n)
    mask = rng.random(n) < 0.9
    l0 = draw(st.floats(0.6, 0.9))
    h0 = draw(st.floats(1.1, 1.5))
    t = lambda x: torch.tensor(x, dtype=F64)  # noqa: E731
    return t(r), t(rh), t(adv), torch.tensor(mask), (l0, h0)


def pos_mass(x, adv, mask, upper, strict=False):
    keep = mask & (adv > 0) & ((x < upper) if strict else (x <= upper))
    return float((adv * x)[keep].sum())


def neg_mass(x, adv, mask, lower):
    keep = mask & (adv < 0) & (x >= lower)
    return float((-adv * x)[keep].sum())


def agg_coefficients(mask, agg, norm_len=None):
    """d loss / d loss_i for each aggregation, written out independently."""
    m = mask.to(F64)
    n_b = m.sum(-1, keepdim=True)
    n_seq = (n_b > 0).sum()
    if agg == "token-mean":
        return m / m.sum()
    if agg == "seq-mean-token-mean":
        return m / (n_seq * n_b.clamp_min(1))
    if agg == "seq-mean-token-sum":
        return m / n_seq
    return m / (n_seq * (norm_len or mask.shape[-1]))


def hand_batch(texts=True):
    """A 3-row RolloutBatch written out by hand."""
    from fp8rl.rollout import RolloutBatch

    # 3 rows: prompts [1 2], [3], [4 5]; responses [6 7], [8 pad], [9 10]
    return RolloutBatch(
        prompt_ids=torch.tensor([[1, 2], [0, 3], [4, 5]]),
        prompt_mask=torch.tensor([[1, 1], [0, 1], [1, 1]]).bool(),
        response_ids=torch.tensor([[6, 7], [8, 0], [9, 10]]),
        response_mask=torch.tensor([[1, 1], [1, 0], [1, 1]]).bool(),
        log_probs=torch.tensor([[-1.0, -2.0], [-3.0, 0.0], [-4.0, -5.0]]),
        entropy=torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, 5.0]]),
        truncated=torch.tensor([True, False, True]),
        response_lengths=torch.tensor([2, 1, 2]),
        prompt_index=torch.tensor([0, 0, 1]),
        texts=["a", "b", "c"] if texts else None,
    )


# ---------------------------------------------------------------- TRL

# find_spec, not an import: importing trl costs seconds, and every test file imports this one
needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install 'trl>=1.16')"
)


def trl_dataset(task, n):
    """The task's first n train samples as a `datasets.Dataset` of prompt and answer."""
    from datasets import Dataset

    samples = task.samples("train")[:n]
    return Dataset.from_dict(
        {"prompt": [s.prompt for s in samples], "answer": [s.answer for s in samples]}
    )


def tiny_grpo(task, output_dir, **args):
    """A tiny Qwen3 for the task's tokenizer and a CPU GRPOConfig (`args` override its fields)."""
    from trl import GRPOConfig

    from fp8rl.models import tiny_qwen3

    tok = task.tokenizer
    model = tiny_qwen3(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2
    )
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    defaults = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        max_steps=6,
        logging_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=4,
        learning_rate=1e-2,
        seed=0,
        save_strategy="no",
        bf16=False,
        temperature=1.0,
        disable_tqdm=True,
    )
    return model, GRPOConfig(**{**defaults, **args})


def trl_parity_reward(completions, **kwargs):
    """TRL's form of parity_reward: mixed rewards for a random model, non-zero advantages."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


# ---------------------------------------------------------------- chat tokenizers

CHATML_DEFAULT_SYSTEM = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a bot.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer(template: str | None, *, add_bos: bool = False):
    """A character-level fast tokenizer with ChatML's special tokens and `template` as its
    chat template; `add_bos`: it prepends <s> to every encoding, as Llama's do."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    chars = sorted(set(string.printable))
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=specials[2:],
    )
    hf.chat_template = template
    return hf


def estimated_noise(old_fp8, old_shadow, new_fp8, new_shadow, mask) -> dict:
    """`estimate_noise` of the two passes' FP8 log-probs and their BF16 shadows."""
    from fp8rl.rl.shadow import ShadowRows, estimate_noise

    advantages = torch.zeros_like(new_fp8)  # the noise reads none
    return estimate_noise(ShadowRows(new_fp8, old_fp8, new_shadow, old_shadow, advantages, mask))


def synthetic_shadow(sd, corr, n=100_000, seed=0, bias=0.0):
    """BF16 log-probs of two passes and FP8 ones = BF16 + errors of (sd, corr) + a bias."""
    from fp8rl.rl.noise import correlated_errors

    g = torch.Generator().manual_seed(seed)
    old_shadow = torch.log_softmax(torch.randn(n, 16, generator=g), -1)[:, 0]
    new_shadow = old_shadow + 0.05 * torch.randn(n, generator=g)  # the policy moved a little
    mask = torch.rand(n, generator=g) > 0.1
    e_new, e_old = correlated_errors(
        old_shadow, torch.ones(n, dtype=torch.bool), sd=sd, corr=corr, generator=g
    )
    old_fp8, new_fp8 = old_shadow + e_old + bias, new_shadow + e_new + bias
    # Padding holds garbage the estimator must not read.
    old_fp8[~mask], new_shadow[~mask] = math.inf, math.nan
    return old_fp8, old_shadow, new_fp8, new_shadow, mask
