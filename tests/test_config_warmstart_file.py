"""config/warmstart_file.py: a warm start as a committed file pair (`X.safetensors`, `X.json`)
and the sha256 check a run makes of it, against hashlib's digest of the bytes."""

import hashlib
import json

import pytest

from fp8rl.config.warmstart_file import info_path_of, verified_sha256, write_with_info
from fp8rl.errors import ConfigError


def _weights(tmp_path, data: bytes = b"weights \x00\x01"):
    path = tmp_path / "src.safetensors"
    path.write_bytes(data)
    return path


def test_the_info_file_sits_beside_the_weights():
    assert str(info_path_of("a/b/ws.safetensors")) == "a/b/ws.json"


def test_a_file_without_info_gets_its_digest(tmp_path):
    src = _weights(tmp_path)
    assert verified_sha256(src) == hashlib.sha256(src.read_bytes()).hexdigest()


def test_the_written_pair_verifies_and_records_the_copys_digest(tmp_path):
    src = _weights(tmp_path)
    out = tmp_path / "committed" / "ws.safetensors"
    info = write_with_info(src, {"steps": 3}, out)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert out.read_bytes() == src.read_bytes()
    assert info == {"steps": 3, "sha256": digest}
    assert json.loads((tmp_path / "committed" / "ws.json").read_text()) == info
    assert verified_sha256(out) == digest


def test_a_changed_or_cut_file_is_refused_naming_the_warm_start(tmp_path):
    out = tmp_path / "ws.safetensors"
    write_with_info(_weights(tmp_path), {}, out)
    out.write_bytes(out.read_bytes()[:-1])  # cut short
    with pytest.raises(ConfigError) as e:
        verified_sha256(out)
    assert e.value.key == "model.warm_start" and "git checkout" in str(e.value)


def test_an_info_file_that_is_no_json_is_refused(tmp_path):
    out = tmp_path / "ws.safetensors"
    write_with_info(_weights(tmp_path), {}, out)
    info_path_of(out).write_text("{not json")
    with pytest.raises(ConfigError) as e:
        verified_sha256(out)
    assert e.value.key == "model.warm_start" and "reads as JSON" in str(e.value)
