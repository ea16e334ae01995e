"""load_pretrained: a saved tiny Qwen3 comes back identical; broken folders name the bad file."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from fp8rl.errors import CheckpointError, ConfigError
from fp8rl.models import load_pretrained, tiny_qwen3
from fp8rl.tasks import char_tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A float32 tiny Qwen3 with a local character tokenizer, saved the Hugging Face way."""
    folder = tmp_path_factory.mktemp("ckpt")
    model = tiny_qwen3(seed=3)
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture
def copy(saved, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(saved[0], folder)
    return folder


def test_round_trip_float32_weights_equal(saved):
    folder, expected = saved
    model, tok = load_pretrained(folder, dtype=torch.float32)
    got = model.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], tensor), name
    # The tokenizer came back too: "12+34=" is <bos> then one id per character.
    assert tok("12+34=")["input_ids"] == [1, 5, 6, 14, 7, 8, 17]
    assert tok.eos_token == "<eos>" and tok.pad_token_id == 0


def test_default_dtype_is_bfloat16_and_auto_keeps_saved_dtype(saved):
    folder, expected = saved
    model, _ = load_pretrained(folder)
    w = model.model.embed_tokens.weight
    assert w.dtype == torch.bfloat16
    assert torch.equal(w, expected["model.embed_tokens.weight"].to(torch.bfloat16))
    auto, _ = load_pretrained(folder, dtype="auto")
    assert auto.model.embed_tokens.weight.dtype == torch.float32


def test_sharded_checkpoint_loads(tmp_path, saved):
    _, expected = saved
    model = tiny_qwen3(seed=3)
    model.save_pretrained(tmp_path, max_shard_size="1MB")
    char_tokenizer().save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    loaded, _ = load_pretrained(tmp_path, dtype=torch.float32)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_missing_folder_and_file_instead_of_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "Qwen3-8B-Base")
    f = tmp_path / "weights.safetensors"
    f.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is a file"):
        load_pretrained(f)


def test_missing_or_malformed_config(copy):
    (copy / "config.json").write_text('{"model_type": "qwen3",')
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON"):
        load_pretrained(copy)
    (copy / "config.json").write_text(json.dumps({"hidden_size": 128}))
    with pytest.raises(CheckpointError, match=r"config\.json: field 'model_type'"):
        load_pretrained(copy)
    (copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_pretrained(copy)


def test_no_weights(copy):
    (copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        load_pretrained(copy)


def test_pickle_weights_are_refused_without_unpickling(copy, monkeypatch):
    (copy / "model.safetensors").unlink()
    (copy / "pytorch_model.bin").write_bytes(b"not even a pickle")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load must never be called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(CheckpointError, match=r"only pickle weights \(pytorch_model\.bin\)"):
        load_pretrained(copy)


def test_index_listing_a_missing_shard(copy):
    index = {
        "metadata": {},
        "weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"},
    }
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"index\.json: lists shard 'model-00002-of-00002\.safetensors'"
    ):
        load_pretrained(copy)


def test_missing_tokenizer(copy):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (copy / name).unlink()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        load_pretrained(copy)


def test_malformed_tokenizer_json(copy):
    (copy / "tokenizer.json").write_text("{oops")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: invalid JSON"):
        load_pretrained(copy)


def test_weights_missing_a_parameter_are_refused(copy):
    # transformers would initialise the missing tensor at random and carry on.
    tensors = load_file(copy / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"lack 1 parameter\(s\): model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        load_pretrained(copy, dtype=torch.float32)


def test_tokenizer_larger_than_embedding(tmp_path):
    tiny_qwen3(vocab_size=16).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)  # 21 tokens
    with pytest.raises(CheckpointError, match="21 tokens but the model's embedding only 16 rows"):
        load_pretrained(tmp_path)


def test_bad_dtype(saved):
    with pytest.raises(ConfigError, match="dtype"):
        load_pretrained(saved[0], dtype="float8")


@pytest.mark.families
def test_a_saved_llama_folder_loads_and_trains_one_fp8_step(tmp_path):
    """A LlamaForCausalLM saved with save_pretrained, as a user's checkpoint: model.source
    loads it unchanged and an FP8-rowwise step converts all its projections and updates it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fp8rl.config import config_from_dict
    from fp8rl.train.trainer import Trainer
    from helpers_config import tiny_config
    from helpers_step import parity_reward

    folder = tmp_path / "llama"
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    saved = load_file(folder / "model.safetensors")
    data = tiny_config(tmp_path / "run", model={"source": str(folder), "tiny": {}})
    data["train"]["steps"] = 1
    trainer = parity_reward(Trainer(config_from_dict(data)))
    assert type(trainer.model).__name__ == "LlamaForCausalLM"
    for name, w in trainer.model.state_dict().items():
        if name in saved:
            torch.testing.assert_close(w, saved[name], rtol=0, atol=0, msg=name)
    assert len(trainer.conversion.converted) == 2 * 7
    assert set(trainer.conversion.skipped) == {"lm_head"}
    (row,) = trainer.fit()
    assert row["actor/grad_norm"] > 0
    moved = trainer.model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(moved, saved["model.layers.0.self_attn.q_proj.weight"])
