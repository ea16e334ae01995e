#!/usr/bin/env bash
# Build a separate venv with verl (it pins other transformers/numpy versions than fp8rl's
# dev venv) and run the verl integration tests there. Usage: scripts/check-verl.sh [pytest args]
#   VERL_SPEC   pip requirement for verl (default: verl)
#   VERL_VENV   where to build the venv (default: build/venv-verl, git-ignored)
#   TORCH_FROM  a python whose torch to reuse (default: .venv/bin/python); empty: pip installs torch
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VERL_VENV:-build/venv-verl}
SPEC=${VERL_SPEC:-verl}
TORCH_FROM=${TORCH_FROM-.venv/bin/python}
PY=${PYTHON:-python3}

# Reuse .venv's torch (several GB saved) through links to torch alone: a .pth pointing at all of
# .venv's site-packages let its other packages leak in (the registry's `kernels`, which the dev
# extra's peers pull in, then broke verl's import of transformers).
. scripts/venv-reuse-torch.sh
venv_reusing_torch "$VENV" "$TORCH_FROM" "$PY" check-verl
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$SPEC" pytest hypothesis uvicorn fastapi  # engine_workers imports both
"$VENV/bin/python" -m pip install -q -e .  # with its own dependencies: none come from .venv now
"$VENV/bin/python" - <<'PY'
import torch, transformers
import verl
from verl.trainer.ppo import core_algos
print(f"verl {getattr(verl, '__version__', '?')}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
"$VENV/bin/python" -m pytest -q -rs tests/test_integrations_verl.py tests/test_integrations_verl_worker.py "$@"
