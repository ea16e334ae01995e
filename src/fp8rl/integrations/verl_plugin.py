"""`VERL_USE_EXTERNAL_MODULES=fp8rl.integrations.verl_plugin`: verl imports this module in
every process that imports verl, so its PPO trainers build fp8rl's actor worker
(`Fp8rlActorRolloutRefWorker`) and the `fp8rl_calibrated` loss is registered (docs/verl.md)."""

from .verl_worker import install

install()
