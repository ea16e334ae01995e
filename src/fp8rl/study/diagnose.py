"""Shadow diagnostics of a policy without training: probe steps whose updates are undone."""

from __future__ import annotations

import copy

from ..step.step import run_step


def diagnose(trainer, steps: int = 1) -> dict:
    """Run `steps` full RL steps with the BF16 shadow passes forced on, restoring the weights
    and optimizer after each, and average the shadow/mismatch metrics they report."""
    # the probe changes only the calibration state (its cadence): the config stays as validated
    trainer.calibration.shadow_passes = True
    trainer.calibration.shadow_every = trainer.calibration.interval = 1
    weights = copy.deepcopy(trainer.model.state_dict())
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    bounds = (trainer.calibration.lower, trainer.calibration.upper)
    sums: dict[str, float] = {}
    for step in range(steps):
        metrics = run_step(trainer.context(), step).metrics
        trainer.model.load_state_dict(weights)
        trainer.optimizer.load_state_dict(opt_state)
        trainer.calibration.lower, trainer.calibration.upper = bounds
        for k, v in metrics.items():
            if k.split("/")[0] in ("shadow", "mismatch", "rollout", "actor"):
                sums[k] = sums.get(k, 0.0) + float(v)
    return {k: v / steps for k, v in sorted(sums.items())}
