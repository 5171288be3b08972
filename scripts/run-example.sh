#!/usr/bin/env bash
# The main job: set up (idempotent), then tune the paper's Mixtral 8x22B case (4 nodes x 8 MI355X,
# GBS 512, seq 8192; paper Sec. 4.7) with the seed planner + offline breakdown-guided proposer, as Ray Tune
# trials on an embedded local Ray, simulate mode, 30 trials. Writes results/mixtral-8x22b-mi355x-4node/:
# ledger.parquet, summary.json, best_so_far.png and Tune's state (tune/). Running it again resumes the
# finished run (nothing is scored twice); pass --fresh to start over. Extra arguments go to `tune`
# (e.g. --max-concurrent 2, --format json). No network access is needed after setup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true
exec .venv/bin/python -m raytune_primus tune experiments/mixtral-8x22b-mi355x-4node.yaml \
  --results results/mixtral-8x22b-mi355x-4node "$@"
