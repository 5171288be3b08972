#!/usr/bin/env bash
# One-call GPU check of benchmark mode (see experiments/gpu_check.py): run from anywhere; uses the system
# python3 with torch (no install, no ray). Outputs go to $OUT (or ./gpu_check_out). Exit 0 = every target
# measured and projected; non-zero = a failure, printed with its reason.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY="${PYTHON:-python3}"
if ! "$PY" -c "import torch, yaml, numpy, scipy" 2>/dev/null; then
  echo "GPU CHECK FAILED: $PY cannot import torch, yaml, numpy and scipy" >&2
  exit 1
fi
exec timeout "${GPU_CHECK_TIMEOUT_S:-540}" "$PY" -m experiments.gpu_check "$@"
