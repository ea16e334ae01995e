"""Fp8GRPOTrainer in 2 processes on the CPU (gloo, set up by accelerate from torchrun's
environment variables): every rank refits on the tokens of all ranks and clips with the same
bounds. Skips without trl, like tests/test_integrations_trl.py."""

import os

import pytest
import torch
import torch.multiprocessing as mp

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach the Hub

from fp8rl.integrations import trl as fp8trl  # noqa: E402
from fp8rl.rl.calibration_state import CalibrationState  # noqa: E402
from helpers_parallel import free_port, leaving_together  # noqa: E402
from helpers_trl import fp8_trainer, needs_trl, tiny_grpo  # noqa: E402

WORLD = 2
STEPS = 6  # generation batches at steps 0, 2, 4: batch 2's tokens refit the bounds at step 4


def _settings():
    # max_step wide open: the rate limit would clamp any refit of a tiny random model to the
    # same bounds, and then local and global refits could agree by accident
    return dict(lower=0.8, upper=1.28, interval=2, min_tokens=2, max_step=(1.0, 1.0))


def _rank_main(rank, port, out_dir):
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    with leaving_together():  # accelerate joins the group inside the trainer
        _train_and_gather(rank, out_dir)


def _train_and_gather(rank, out_dir):
    import torch.distributed as dist

    from fp8rl.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", train_size=32, test_size=4)
    model, args = tiny_grpo(
        task,
        f"{out_dir}/trl",
        max_steps=STEPS,
        per_device_train_batch_size=4,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    observed = []  # per calibration: the step, this rank's pooled tokens, what the state saw
    real_gather = fp8trl.gather_tokens

    def recording_gather(tensors):
        out = real_gather(tensors)
        observed.append({"step": trainer._pool_step, "local": dict(tensors), "global": dict(out)})
        return out

    fp8trl.gather_tokens = recording_gather
    trainer = fp8_trainer(task, model, args, calibration=CalibrationState(**_settings()))
    assert dist.is_initialized() and dist.get_world_size() == WORLD and dist.get_rank() == rank
    trainer.train()
    n = (3, 0)[rank]  # the gather on its own: uneven ranks, one without tokens, bf16 kept
    uneven = {
        "ratio": torch.arange(n, dtype=torch.float32).reshape(1, -1) + 10 * rank,
        "adv": torch.full((1, n), -0.5 - rank, dtype=torch.bfloat16),
    }
    gathered = {"uneven": real_gather(uneven), "none": real_gather({"ratio": torch.zeros(1, 0)})}
    torch.save(
        {
            "observed": observed,
            "bounds": trainer.calibration.bounds,
            "history": trainer.calibration.history,
            "epsilons": (trainer.epsilon_low, trainer.epsilon_high),
            "gathered": gathered,
        },
        f"{out_dir}/rank{rank}.pt",
    )


def _replay(observations) -> CalibrationState:
    """One process's CalibrationState fed these (step, tokens) in order."""
    state = CalibrationState(**_settings())
    for step, t in observations:
        mask = torch.ones_like(t["ratio"], dtype=torch.bool)
        state.observe(step, t["ratio"], t["ratio_shadow"], t["adv"], mask)
    return state


@needs_trl
def test_two_processes_refit_on_the_gathered_tokens_and_clip_with_the_same_bounds(tmp_path):
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    # batches 0 and 2 were shadow batches; their tokens reached the state at generations 2, 4
    assert [o["step"] for o in r0["observed"]] == [o["step"] for o in r1["observed"]] == [0, 2]
    keys = ("ratio", "ratio_shadow", "adv")
    both = [
        (a["step"], {k: torch.cat([a["local"][k], b["local"][k]], dim=1) for k in keys})
        for a, b in zip(r0["observed"], r1["observed"], strict=True)
    ]
    alone = [_replay([(o["step"], o["local"]) for o in r["observed"]]) for r in (r0, r1)]
    # not trivial: each rank sampled other prompts, and calibrating on its own tokens alone
    # (what the trainer did before the gather) gives each rank other bounds
    a, b = r0["observed"][1]["local"]["ratio"], r1["observed"][1]["local"]["ratio"]
    assert a.shape != b.shape or not torch.equal(a, b)
    assert alone[0].bounds != pytest.approx(alone[1].bounds)
    # the same state on both ranks: the one a single process gets on both ranks' tokens
    assert r0["history"] == r1["history"] and r0["bounds"] == r1["bounds"]
    one = _replay(both)
    assert [h["step"] for h in one.history] == [2] and one.bounds != pytest.approx(one.nominal)
    assert r0["history"] == one.history and r0["bounds"] == one.bounds
    # what the state observed, on each rank: the concatenation in rank order
    for r in (r0, r1):
        for o, (_, want) in zip(r["observed"], both, strict=True):
            for k in keys:
                assert torch.equal(o["global"][k], want[k]), k
    # and TRL clips with those bounds on both ranks
    for r in (r0, r1):
        assert (1 - r["epsilons"][0], 1 + r["epsilons"][1]) == pytest.approx(one.bounds)
    for r in (r0, r1):
        got = r["gathered"]["uneven"]
        assert torch.equal(got["ratio"], torch.tensor([[0.0, 1.0, 2.0]]))
        assert torch.equal(got["adv"], torch.full((1, 3), -0.5, dtype=torch.bfloat16))
        assert r["gathered"]["none"]["ratio"].shape == (1, 0)


@pytest.fixture(autouse=True)
def _no_inherited_rendezvous(monkeypatch):
    # a test process started by torchrun itself would hand its rank to the children
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_one_process_gathers_nothing():
    tokens = {"ratio": torch.ones(1, 3)}
    assert fp8trl.gather_tokens(tokens) is tokens
