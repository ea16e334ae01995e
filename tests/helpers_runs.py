"""What tests read from a run or its folder: a trained model and optimizer to checkpoint,
a folder's bytes, the one CLI error line, the warm starts a run builds.

A test file imports helpers from the tests/helpers_*.py modules, never from another test
file (tests/test_test_hygiene.py checks it). Imports at the top stay within the standard
library, pytest, torch, numpy and hypothesis: the helpers are imported in the vLLM venv too
(scripts/check-vllm.sh); fp8rl and the optional peers are imported inside the helpers."""

from __future__ import annotations

import torch


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


def strip_times(rows: list[dict]) -> list[dict]:
    """Metrics rows without their `time/*` keys: what two runs of the same seed share."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def warm_started(path, data: dict, *, steps: int, lr: float = 3e-3):
    """The config data's model after a brief supervised warm start, saved to `path`: groups
    then get mixed rewards, so updates happen."""
    from fp8rl.config import config_from_dict
    from fp8rl.tasks import get_task
    from fp8rl.train.build import build_model
    from fp8rl.train.checkpoint import save_weights
    from fp8rl.train.warmstart import warm_start

    cfg = config_from_dict(data)
    task = get_task(cfg.task.name, **cfg.task.options)
    model, tok = build_model(cfg.model, task, torch.device("cpu"))
    warm_start(model, tok, task.sft_examples("train"), steps=steps, batch_size=32, lr=lr)
    save_weights(model, path)
    return path


def train_argv(cfg_path, out, *extra) -> list[str]:
    """`fp8rl train`'s arguments for the config file `cfg_path` into the run folder `out`."""
    return ["train", "--config", str(cfg_path), "--out", str(out), "--no-progress", *extra]


def train_command(cfg_path, out, *extra) -> list[str]:
    """`python -m fp8rl train ...` (train_argv) as a subprocess's command."""
    import sys

    return [sys.executable, "-m", "fp8rl", *train_argv(cfg_path, out, *extra)]


def killed_and_resumed(cfg_path, tmp_path, *, steps: int, kill_after: int, timeout: float):
    """The metrics rows of an uninterrupted CLI run of `cfg_path` (tmp_path/full) and of one
    SIGKILLed once it has written `kill_after` rows, then resumed (tmp_path/killed)."""
    import os
    import signal
    import subprocess
    import time

    from fp8rl.train.runlog import read_metrics

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(train_command(cfg_path, full), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(
        train_command(cfg_path, killed),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + timeout
    while time.time() < deadline and len(read_metrics(killed)) < kill_after and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(killed)) < steps, "the run finished before it could be killed"
    resume = train_command(cfg_path, killed, "--resume")
    subprocess.run(resume, check=True, env=env, capture_output=True)
    return read_metrics(full), read_metrics(killed)
