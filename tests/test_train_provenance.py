"""RUN/provenance.json: one entry per start and resume, with the code commit and dirty flag
of fp8rl's own git tree, the machine and the package versions; "unknown" without git."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata
from pathlib import Path

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
