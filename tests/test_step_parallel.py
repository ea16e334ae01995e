"""The ragged all-gather of the Trainer, TRL and verl (fp8rl.step.parallel) in 2 processes
on the CPU (gloo): uneven sizes, a rank without rows, along rows and along tokens, dtypes
kept."""

import os

import torch
import torch.multiprocessing as mp

from fp8rl.step.parallel import gather_ragged, world_size
from helpers_parallel import free_port, leaving_together

WORLD = 2


def _local(rank):
    n = (3, 0)[rank]  # rank 1 holds nothing
    rows = {
        "x": torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * rank,
        "mask": torch.ones(n, 2, dtype=torch.bool),
        "adv": torch.full((n,), -0.5 - rank, dtype=torch.bfloat16),
    }
    tokens = {"t": torch.arange(2 * (rank + 1), dtype=torch.float64).reshape(2, -1)}
    return rows, tokens


def _rank_main(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    with leaving_together():
        rows, tokens = _local(rank)
        empty = {"x": torch.zeros(0, 4)}
        out = {
            "world": world_size(),
            "rows": gather_ragged(rows),
            "tokens": gather_ragged(tokens, dim=1),
            "empty_is_input": gather_ragged(empty) is empty,
        }
        torch.save(out, f"{out_dir}/rank{rank}.pt")


def test_two_ranks_get_every_ranks_rows_in_rank_order(tmp_path):
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    local = [_local(r) for r in range(WORLD)]
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert got["world"] == WORLD and got["empty_is_input"]
        for name, x in got["rows"].items():
            want = torch.cat([rows[name] for rows, _ in local])
            assert x.dtype == want.dtype and torch.equal(x, want), name
        assert got["rows"]["x"].shape == (3, 2)
        want = torch.cat([tokens["t"] for _, tokens in local], dim=1)
        assert torch.equal(got["tokens"]["t"], want) and want.shape == (2, 3)


def test_one_process_gets_its_own_tensors_back():
    tensors = {"x": torch.ones(2, 3)}
    assert world_size() == 1 and gather_ragged(tensors) is tensors
