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

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ -n "$TORCH_FROM" ] && [ -x "$TORCH_FROM" ]; then
  # Reuse an installed torch (a CPU or CUDA build: several GB saved) through a .pth file;
  # the venv's own site-packages come first on sys.path, so verl's pins still win.
  torch_dir=$("$TORCH_FROM" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$torch_dir" > "$site/zz-reuse-torch.pth"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$SPEC" pytest hypothesis uvicorn fastapi  # engine_workers imports both
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" - <<'PY'
import torch, transformers
import verl
from verl.trainer.ppo import core_algos
print(f"verl {getattr(verl, '__version__', '?')}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
"$VENV/bin/python" -m pytest -q -rs tests/test_integrations_verl.py tests/test_integrations_verl_worker.py "$@"
