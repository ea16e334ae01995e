"""`torchrun --nproc-per-node 2 -m fp8rl train` end to end on the CPU (gloo).

The command line path (config file, process group from torchrun's environment, rank-0 files,
checkpoint, `--resume`) against one in-process Trainer on the same global batch. The
resumed half switches to the fsdp2 strategy: a checkpoint written by one strategy must
continue under the other, and the continuation must still match the uninterrupted reference.
"""

import json
import os
import subprocess
import sys

import pytest

from fp8rl.config import config_from_dict
from fp8rl.train.trainer import Trainer
from helpers_config import tiny_config
from helpers_parallel import TINY_DP, compare_rows, free_port


def cli_config(out_dir, steps: int) -> dict:
    # high precision throughout: FP8 rounding turns the float32 rounding by which the two
    # runs' weights differ after an update into e4m3 steps (test_distributed's docstring)
    return tiny_config(
        out_dir,
        name="torchrun",
        model={"tiny": dict(TINY_DP)},
        rollout={"precision": "bf16"},
        train={"precision": "bf16", "steps": steps},
        loss={"mode": "calibrated"},
        log={"checkpoint_every": 2, "eval_size": 4},
    )


def torchrun(cfg_path, out_dir, *extra, strategy=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("FP8RL_DP_STRATEGY", None)
    if strategy:
        env["FP8RL_DP_STRATEGY"] = strategy
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "fp8rl",
        "train",
        "--config",
        str(cfg_path),
        "--no-progress",
        "--out",
        str(out_dir),
        *extra,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_torchrun_two_ranks_train_checkpoint_and_resume(tmp_path):
    out = tmp_path / "run"
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(cli_config(out, steps=3)))

    first = torchrun(cfg_path, out, "train.steps=2")
    assert (
        first.stdout.count("data parallel: 2 ranks, strategy allreduce, backend gloo") == 1
    )  # rank 0 only
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]
    torchrun(cfg_path, out, "--resume", "train.steps=3", strategy="fsdp2")  # extended to 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000002",
        "step_00000003",
    ]

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # one writer; the resume appended step 2 alone
    events = (out / "events.log").read_text()
    assert "strategy allreduce" in events and "strategy fsdp2" in events
    final = json.loads((out / "final.json").read_text())
    # the whole run's summary (all of metrics.jsonl, not the resumed step alone) and its eval
    assert final["steps"] == 3 and "eval/mean@1" in final

    ref = Trainer(config_from_dict(cli_config(tmp_path / "one", steps=3)))
    ref.rollout_shards = 2  # sample each half of the groups as rank 0 / rank 1 do
    want = ref.fit()
    assert any(r["actor/grad_norm"] > 0 for r in want)  # the comparison covers a real update
    compare_rows(rows, [json.loads(json.dumps(r)) for r in want])


@pytest.fixture(autouse=True)
def _no_inherited_rendezvous(monkeypatch):
    # a test process started by torchrun itself would hand its rank to the children
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
