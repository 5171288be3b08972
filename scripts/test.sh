#!/usr/bin/env bash
# One command: set up (idempotent) and run the whole test suite, CPU-only and offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true
exec .venv/bin/python -m pytest "$@"
