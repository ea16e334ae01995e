"""Data parallel on the CPU (gloo): 2 ranks against one process on the same global batch.

Training runs in high precision: FP8 training quantizes the weight-gradient GEMM with
scales over the micro-batch's tokens, so any re-partition of a mini-batch (micro-batches in
one process, ranks here) changes FP8 gradients beyond rounding. The rollout stays FP8.
The reference is a plain Trainer with `rollout_shards = 2`: it samples each half of the
groups with the generator that rank would use, so both see the same rollout rows; every
other computation (loss normalizers, mini-batch split, Algorithm 1 over all tokens,
metric means) must then agree to float32 rounding.
"""

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from fp8rl.train.config import config_from_dict
from fp8rl.train.trainer import Trainer

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def config(out_dir, **loss) -> dict:
    return {
        "name": "dp",
        "task": {
            "name": "arithmetic",
            "options": {"digits": 1, "ops": "+", "train_size": 64, "test_size": 16},
        },
        "model": {"source": "tiny", "tiny": dict(TINY)},
        "rollout": {"precision": "fp8-rowwise", "prompts_per_step": 6, "n": 4, "max_new_tokens": 5},
        "train": {
            "precision": "bf16",
            "steps": 3,
            "lr": 1e-3,
            "mini_batches": 2,
            "micro_batch_size": 3,
        },
        "loss": {"mode": "calibrated", **loss},
        "calibration": {"interval": 1, "min_tokens": 2},
        "log": {"out_dir": str(out_dir), "checkpoint_every": 3, "eval_size": 0, "progress": False},
    }


def parity_reward(trainer):
    """Mixed rewards in every group of a random tiny model, hence non-zero advantages."""
    from fp8rl.tasks import RewardResult

    trainer.task.reward = lambda text, sample: RewardResult(
        float(sum(map(ord, text)) % 2), {"parsed": True}
    )
    return trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, data, out_dir, strategy):
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from fp8rl.train.distributed import DistributedTrainer

        trainer = parity_reward(DistributedTrainer(config_from_dict(data), strategy=strategy))
        rows = trainer.fit()
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        if strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            weights = get_model_state_dict(
                trainer.model, options=StateDictOptions(full_state_dict=True)
            )
        torch.save({"rows": rows, "weights": weights}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(data, out_dir, world=2, strategy="allreduce"):
    mp.spawn(
        _rank_main,
        args=(world, _free_port(), data, str(out_dir), strategy),
        nprocs=world,
        join=True,
    )
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _compare_rows(got, want, rtol):
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        keys = {k for k in w if not k.startswith("time/")}
        assert keys == {k for k in g if not k.startswith("time/")}
        for k in sorted(keys):
            if w[k] is None or isinstance(w[k], str):
                assert g[k] == w[k], k
            else:
                assert g[k] == pytest.approx(w[k], rel=rtol, abs=1e-6), (g["step"], k, g[k], w[k])


@pytest.mark.parametrize(
    ("strategy", "loss"),
    [("allreduce", {}), ("allreduce", {"mode": "dapo", "dynamic_sampling": True}), ("fsdp2", {})],
    ids=["allreduce-calibrated", "allreduce-dapo", "fsdp2-calibrated"],
)
def test_two_ranks_match_one_process_on_the_same_global_batch(tmp_path, strategy, loss):
    data = config(tmp_path / "dp", **loss)
    ranks = run_ranks(data, tmp_path, strategy=strategy)
    ref = parity_reward(
        Trainer(
            config_from_dict({**data, "log": {**data["log"], "out_dir": str(tmp_path / "one")}})
        )
    )
    ref.rollout_shards = 2
    want = ref.fit()
    # rank 0 logs; rank 1 computed the same global metrics
    _compare_rows(ranks[0]["rows"], want, rtol=1e-4)
    _compare_rows(ranks[1]["rows"], want, rtol=1e-4)
    assert any(r["actor/grad_norm"] > 0 for r in want)  # the comparison covers real updates
    if loss == {}:
        # the refits (steps >= 1; step 0 never enters the pool) ran on the gathered tokens
        assert all(r["calib/n_neg"] + r["calib/n_pos"] > 0 for r in want[1:])
    # Adam turns float32 noise in a near-zero gradient into up to ~1e-5 of weight change
    # (a step is lr = 1e-3): a real error (a wrong normalizer, a missing rank) moves far more
    for name, w in ref.model.state_dict().items():
        for rank in ranks:
            torch.testing.assert_close(
                rank["weights"][name], w, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
            )
    # files: one metrics log and one checkpoint, written by rank 0
    lines = (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    assert f"strategy {strategy}" in (tmp_path / "dp" / "events.log").read_text()


@pytest.mark.parametrize("strategy", ["allreduce", "fsdp2"])
def test_two_rank_checkpoint_resumes_in_one_process(tmp_path, strategy):
    """Checkpoints hold the full state (FSDP2 gathers it): any rank count can continue them."""
    data = config(tmp_path / "dp")
    data["train"]["steps"] = 2
    data["log"]["checkpoint_every"] = 2
    ranks = run_ranks(data, tmp_path, strategy=strategy)
    cont = Trainer(config_from_dict({**data, "train": {**data["train"], "steps": 3}}))
    assert cont.resume() and cont.step == 2
    for name, w in cont.model.state_dict().items():
        torch.testing.assert_close(w, ranks[0]["weights"][name], rtol=0, atol=0, msg=name)
    last = ranks[0]["rows"][
        -1
    ]  # interval 1: the last step calibrated the bounds the checkpoint holds
    assert (cont.calibration.lower, cont.calibration.upper) == (
        last["calib/next_lower"],
        last["calib/next_upper"],
    )
