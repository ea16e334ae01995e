"""`fp8rl sweep`'s default --jobs: min(usable cores, runs that fit in MemAvailable), from
monkeypatched memory figures; the parameter count against hand sums and built models."""

from __future__ import annotations

import pytest

from fp8rl.config import config_from_dict
from fp8rl.study.sweep import runner
from fp8rl.study.sweep.memory import (
    available_memory,
    default_jobs,
    param_count,
    peak_estimate,
    sweep_default_jobs,
)
from helpers_config import sweep_spec, tiny_config

GIB = 1 << 30
# SmolLM2-135M-Instruct's config.json fields
SMOLLM2 = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "tie_word_embeddings": True,
}


def test_param_count_of_smollm2_by_hand():
    # embeddings 49152 x 576; a layer: q, o 576 x 576, k, v 576 x 192, MLP 3 x 576 x 1536
    layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert param_count(SMOLLM2) == 49152 * 576 + 30 * layer == 134_479_872


@pytest.mark.parametrize(
    "family,overrides",
    [
        ("qwen3", {}),
        ("llama", {"tie_word_embeddings": False, "num_key_value_heads": 2}),
        ("qwen3_moe", {}),
    ],
)
def test_param_count_is_a_built_models_without_its_norms(family, overrides):
    from fp8rl.models.tiny import tiny_defaults, tiny_model

    model = tiny_model(family, **overrides)
    built = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    assert param_count({**tiny_defaults(family), **overrides}) == built


@pytest.mark.parametrize(
    "cores,available,peak,jobs",
    [
        (8, 10 * GIB, 3 * GIB, 3),  # memory binds: floor(10 / 3)
        (2, 100 * GIB, GIB, 2),  # the cores bind
        (4, GIB, 3 * GIB, 1),  # not even one fits: one anyway
        (4, None, GIB, 4),  # unreadable /proc/meminfo: the cores
        (4, 10 * GIB, None, 4),  # a model whose shape is unknown: the cores
    ],
)
def test_default_jobs_is_the_cores_or_the_runs_that_fit(cores, available, peak, jobs):
    got, why = default_jobs(cores, available, peak)
    assert got == jobs
    assert f"{cores} usable core(s)" in why
    if available is None or peak is None:
        assert "unknown" in why
    elif available < peak:
        assert why.endswith("= 0 that fit; one at a time anyway")


def test_available_memory_reads_memavailable(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:  24683784 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(f) == 2048 * 1024
    f.write_text("MemTotal:  24683784 kB\n")
    assert available_memory(f) is None
    assert available_memory(tmp_path / "missing") is None


def test_the_estimate_grows_with_the_rows_and_the_largest_run_sizes_the_sweep(tmp_path):
    small = config_from_dict(tiny_config(tmp_path, rollout={"prompts_per_step": 4}))
    wide = {"hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 8}
    big = config_from_dict(
        tiny_config(tmp_path, rollout={"prompts_per_step": 64}, model={"tiny": wide})
    )
    assert peak_estimate(big) > peak_estimate(small) > 0
    fp32 = {"precision": "fp32"}
    plain = config_from_dict(
        tiny_config(tmp_path, rollout={"prompts_per_step": 4, **fp32}, train=fp32)
    )
    assert peak_estimate(small) > peak_estimate(plain)  # FP8 emulation's copies
    available = 3 * peak_estimate(big)
    assert sweep_default_jobs([small, big], 16, available)[0] == 3
    assert sweep_default_jobs([small], 16, available)[0] > 3


class Chosen(Exception):
    pass


def _capture_jobs(monkeypatch):
    def execute(pending, configs, workers, *args):
        raise Chosen(workers[0])

    monkeypatch.setattr(runner, "_execute", execute)


def test_a_sweep_defaults_to_the_runs_that_fit_and_says_why(tmp_path, monkeypatch, capsys):
    _capture_jobs(monkeypatch)
    monkeypatch.setattr(runner, "usable_cores", lambda: 8)
    spec = sweep_spec(tmp_path)
    peak = peak_estimate(config_from_dict(spec["base"]))
    monkeypatch.setattr(runner, "available_memory", lambda: 2 * peak + peak // 2)
    with pytest.raises(Chosen) as e:
        runner.run_sweep(spec, tmp_path / "out", progress=False)
    assert e.value.args[0] == 2
    err = capsys.readouterr().err
    assert "fp8rl sweep: 2 job(s) at a time: 8 usable core(s)" in err and "2 that fit" in err


def test_an_explicit_jobs_always_wins(tmp_path, monkeypatch, capsys):
    _capture_jobs(monkeypatch)
    monkeypatch.setattr(runner, "available_memory", lambda: 1)  # nothing fits
    with pytest.raises(Chosen) as e:
        runner.run_sweep(sweep_spec(tmp_path), tmp_path / "out", jobs=3, progress=False)
    assert e.value.args[0] == 3
    assert "job(s) at a time" not in capsys.readouterr().err
