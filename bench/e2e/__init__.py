"""bench/gpu_e2e.py's parts, one module each: shapes and set-up, the checks before timing, the
training step, the rollout, the GRPO run, the goals and the profiles. The driver is
bench/gpu_e2e.py; bench/gpu_rollout.py shares the Qwen3 shapes."""
