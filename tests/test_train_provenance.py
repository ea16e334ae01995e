"""RUN/provenance.json: one entry per start and resume, with the code commit and dirty flag
of fp8rl's own git tree, the machine and the package versions; "unknown" without git."""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

from fp8rl.config import config_from_dict
from fp8rl.train import provenance
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config

REPO = Path(__file__).resolve().parents[1]


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def test_every_start_and_resume_of_a_run_records_where_it_came_from(tmp_path):
    run = tmp_path / "run"
    data = tiny_config(run, train={"steps": 1}, log={"checkpoint_every": 1, "eval_size": 0})
    Trainer(config_from_dict(data)).fit()
    data["train"]["steps"] = 2
    Trainer(config_from_dict(data)).fit(resume=True)
    entries = json.loads((run / provenance.FILE).read_text())
    assert [e["from_step"] for e in entries] == [0, 1]
    first = entries[0]
    if _git("rev-parse", "--show-toplevel"):  # a clone: the commit this code is
        assert first["code"]["commit"] == _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        assert first["code"]["dirty"] is dirty
    assert first["packages"]["torch"] == metadata.version("torch")
    assert first["packages"]["transformers"] == metadata.version("transformers")
    assert first["machine"]["cpus"] and first["machine"]["platform"]


def test_without_git_the_commit_is_unknown(monkeypatch):
    monkeypatch.setattr(provenance, "_git", lambda *a, **kw: None)  # no git, or not a repo
    assert provenance.code_version() == {"commit": "unknown", "dirty": "unknown"}
    monkeypatch.setattr(provenance, "_git", lambda *a, **kw: "/some/other/repo")
    assert provenance.code_version()["commit"] == "unknown"  # a venv inside another repo


def test_the_weights_a_run_starts_from_are_named_by_their_sha256(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")
    init, warm = tmp_path / "init.safetensors", tmp_path / "warm.safetensors"
    init.write_bytes(b"other")
    warm.write_bytes(b"third")
    model = SimpleNamespace(source=str(folder), init_weights=str(init), warm_start=str(warm))
    assert provenance.start_weights(model) == {
        str(folder / "model.safetensors"): hashlib.sha256(b"weights").hexdigest(),
        str(init): hashlib.sha256(b"other").hexdigest(),
        str(warm): hashlib.sha256(b"third").hexdigest(),
    }
    tiny = SimpleNamespace(source="tiny", init_weights=None, warm_start="auto")
    assert provenance.start_weights(tiny) == {}


def test_a_run_records_its_start_weights(tmp_path):
    first = tmp_path / "first"
    data = tiny_config(first, train={"steps": 1}, log={"checkpoint_every": 1, "eval_size": 0})
    Trainer(config_from_dict(data)).fit()
    assert json.loads((first / provenance.FILE).read_text())[0]["weights"] == {}
    (init,) = (first / "checkpoints").glob("step_*/model.safetensors")  # real trained weights
    second = tmp_path / "second"
    data = tiny_config(second, train={"steps": 1}, log={"eval_size": 0})
    data["model"]["init_weights"] = str(init)
    Trainer(config_from_dict(data)).fit()
    entries = json.loads((second / provenance.FILE).read_text())
    assert entries[0]["weights"] == {str(init): hashlib.sha256(init.read_bytes()).hexdigest()}
