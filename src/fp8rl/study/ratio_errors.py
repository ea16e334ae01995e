"""The distribution of FP8's log-ratio errors against the BF16 shadow, per token: how far it is
from a Gaussian of the same sd (docs/study.md). Runs a few real steps of a sweep arm's config
(updates included) and pools e = (logp - old)_fp8 - (logp - old)_bf16 over response tokens.

    python -m fp8rl.study.ratio_errors configs/study.yaml --arm fp8 --seed 100 --steps 3
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from ..config import config_from_dict
from ..rl.shadow import LOG_RATIO_TAIL
from ..step.step import run_step
from ..train.trainer import Trainer
from ..utils import run_main
from .sweep.spec import load_spec

THRESHOLDS = (0.05, 0.1, LOG_RATIO_TAIL)  # -log 0.8: an error this size alone crosses L = 0.8


def collect_errors(cfg, steps: int) -> torch.Tensor:
    """Per-token log-ratio errors of `steps` steps of `cfg` (a shadow step each)."""
    trainer = Trainer(cfg, progress=False)
    # every step a shadow step, set on the calibration state only: the config stays as validated
    trainer.calibration.shadow_passes = True
    trainer.calibration.shadow_every = 1
    errors = []
    for step in range(steps):
        rows = run_step(trainer.context(), step).shadow
        if rows is None:  # dynamic sampling dropped every group: no update, no rows
            continue
        e = (rows.log_prob - rows.old_log_prob) - (rows.log_prob_shadow - rows.old_log_prob_shadow)
        errors.append(e[rows.mask.bool()])
    return torch.cat(errors).double()


def tail_stats(e: torch.Tensor) -> dict:
    """sd, excess kurtosis, and for each threshold the measured share of |e| above it next to
    the share a Gaussian of the same sd would have."""
    sd = e.std().item()
    z = (e - e.mean()) / sd
    out = {
        "tokens": e.numel(),
        "sd": sd,
        "excess_kurtosis": (z**4).mean().item() - 3,
        "max_abs": e.abs().max().item(),
        "tails": {},
    }
    for t in THRESHOLDS:
        out["tails"][str(t)] = {
            "measured": (e.abs() > t).double().mean().item(),
            "gaussian": math.erfc(t / sd / math.sqrt(2)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8rl.study.ratio_errors")
    p.add_argument("spec", help="a sweep spec (configs/study.yaml)")
    p.add_argument("--arm", default="fp8")
    p.add_argument("--seed", type=int, default=100, help="keep it outside the study's seeds")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="runs/ratio-errors", help="the scratch run folder")
    a = p.parse_args(argv)
    spec = load_spec(a.spec)
    if a.arm not in spec.arms:
        p.error(f"--arm {a.arm}: one of {', '.join(spec.arms)}")
    torch.set_num_threads(1)
    cfg = config_from_dict(spec.run_data(a.arm, a.seed, a.out))
    print(json.dumps(tail_stats(collect_errors(cfg, a.steps)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
