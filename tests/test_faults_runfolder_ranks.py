"""The run-folder lock under data parallelism: rank 0 holds it, a refusal reaches every
rank (none hangs), and the ranks of one job share a warm-start build rather than refuse
each other. Ranks are gloo processes on the CPU (torch.multiprocessing.spawn)."""

import json
import os
from pathlib import Path

import pytest

from helpers_config import tiny_config
from helpers_parallel import free_port, leaving_together
from helpers_runs import snapshot


def _in_group(rank, world, port, body, *args):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with leaving_together():
        body(rank, *args)


def _fit_refused(rank, data, out_dir):
    from fp8rl.config import config_from_dict
    from fp8rl.errors import Fp8rlError
    from fp8rl.train.distributed import DistributedTrainer

    trainer = DistributedTrainer(config_from_dict(data))
    try:
        trainer.fit()
        result = "ran"
    except Fp8rlError as e:
        result = str(e)
    Path(out_dir, f"rank{rank}.txt").write_text(result)


def test_two_ranks_on_a_locked_run_folder_both_stop_with_the_holders_pid(tmp_path):
    """Only rank 0 takes the lock; a refusal reaches every rank (none waits at a collective
    for a rank that stopped), and the folder is left as it was."""
    import fcntl
    import time

    import torch.multiprocessing as mp

    run = tmp_path / "run"
    data = tiny_config(run, log={"eval_size": 0})
    data["train"]["precision"] = "bf16"
    run.mkdir()
    # held as run_folder.py documents it (an flock on RUN/.lock naming its pid), by hand
    with open(run / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(json.dumps({"pid": os.getpid(), "host": "here", "what": "a test holder"}))
        lock.flush()
        before = snapshot(run)
        args = (2, free_port(), _fit_refused, data, str(tmp_path))
        ctx = mp.spawn(_in_group, args=args, nprocs=2, join=False)
        deadline = time.monotonic() + 240
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("the ranks hung on a refused run folder")
        assert snapshot(run) == before
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert "ran" != text and (f"pid {os.getpid()}" in text or "rank 0" in text), text
    assert f"pid {os.getpid()}" in (tmp_path / "rank0.txt").read_text()


def _built_start(rank, data, out_dir, cache):
    import torch

    from fp8rl.config import config_from_dict
    from fp8rl.train.distributed import DistributedTrainer

    os.environ["FP8RL_CACHE"] = cache
    trainer = DistributedTrainer(config_from_dict(data), progress=False)
    total = sum(float(p.double().sum()) for p in trainer.model.parameters())
    torch.save(total, f"{out_dir}/rank{rank}.pt")


def test_two_ranks_share_one_warm_start_build_without_refusing_each_other(tmp_path):
    """Both ranks need the same missing warm start: one builds it under the lock, the other
    waits for it (no refusal of its own job), and both start from the same weights."""
    import torch
    import torch.multiprocessing as mp

    from helpers_config import FAST_WARM_START

    data = tiny_config(tmp_path / "run", log={"eval_size": 0}, warm_start=FAST_WARM_START)
    data["model"]["warm_start"] = "auto"
    cache = tmp_path / "cache"
    args = (2, free_port(), _built_start, data, str(tmp_path), str(cache))
    mp.spawn(_in_group, args=args, nprocs=2, join=True)
    built = sorted(p.name for p in (cache / "warmstart").iterdir())
    assert len(built) == 2 and built[0].endswith(".json") and built[1].endswith(".safetensors")
    totals = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert totals[0] == totals[1]
