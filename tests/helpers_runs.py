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
