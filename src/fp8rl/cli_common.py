"""What the `fp8rl` commands share: the overrides' help, strict JSON output, integer flag
checks and a trainer on a config and checkpoint in a scratch folder (cli.py, cli_eval.py)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

EPILOG_OVERRIDES = (
    "Overrides are dotted keys of the config, e.g. train.lr=1e-6 rollout.n=16 "
    "loss.mode=calibrated calibration.interval=20 rollout.precision=fp8-blockwise."
)


def _dumps(result) -> str:
    """Strict JSON: NaN and inf become null (json.dumps would write bare NaN)."""
    from .utils import json_safe

    return json.dumps(json_safe(result), indent=1, allow_nan=False)


def _at_least(flag: str, value: int | None, least: int) -> None:
    if value is not None and value < least:
        from .errors import ConfigError

        raise ConfigError(flag, value, f"an integer >= {least}")


def _with_checkpoint(overrides: list[str], checkpoint: str | None) -> tuple[list[str], Path | None]:
    if not checkpoint:
        return overrides, None
    from .errors import CheckpointError
    from .train.checkpoint import latest_checkpoint

    path = Path(checkpoint)
    # the checkpoint's weights replace the start weights: no warm start to build for them
    if path.is_file() and path.suffix == ".safetensors":
        return overrides + [f"model.init_weights={path}"], None
    if (path / "model.safetensors").is_file():
        return overrides + ["model.warm_start=none"], path
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(
            f"--checkpoint {checkpoint}: no checkpoint folder, run folder or .safetensors file"
        )
    return overrides + ["model.warm_start=none"], latest


@contextlib.contextmanager
def _trainer_for(a):
    """A Trainer on the config and checkpoint, its scratch run folder a temporary one (removed
    afterwards; FP8RL_SCRATCH names a folder to keep instead): nothing lands in the cwd."""
    from .config import load_config
    from .train.checkpoint import load_checkpoint
    from .train.trainer import Trainer

    overrides, ckpt = _with_checkpoint(list(a.overrides), a.checkpoint)
    keep = os.environ.get("FP8RL_SCRATCH")
    with contextlib.ExitStack() as stack:
        scratch = keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="fp8rl-scratch-"))
        cfg = load_config(a.config, overrides + [f"log.out_dir={scratch}"])
        trainer = Trainer(cfg, progress=False)
        if ckpt is not None:
            load_checkpoint(ckpt, trainer.model, None, restore_rng=False)
        yield trainer
