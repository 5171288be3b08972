#!/usr/bin/env bash
# Create .venv and install raytune-primus with its test dependencies.
# torch is installed FIRST and pinned (torch==2.13.0): on these machines pip takes a CPU build from
# local disk; any other torch request may pull a multi-GB CUDA build. Everything else comes from
# PyPI through uv (fast) and leaves the installed torch alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check uv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
fi
.venv/bin/python -m uv pip install -q --python .venv/bin/python -e ".[test]"
echo "setup done: $(.venv/bin/python -c 'import torch, ray, optuna, dspy; print("torch", torch.__version__, "ray", ray.__version__, "optuna", optuna.__version__, "dspy", dspy.__version__)')"
