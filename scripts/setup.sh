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
# --compile-bytecode: uv installs no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set every fresh process
# (Ray actors, test subprocesses) recompiles scipy, ray, ... from source (~1.3 s CPU each here)
.venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python -e ".[test]"
# Headless Chromium renders the HTML report in a test (tests/raytune_primus/test_report.py skips without
# it); installed from Debian's packages when missing and we may (root with apt-get), never fatal.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "note: could not install chromium; the report rendering test will be skipped" >&2
fi
echo "setup done: $(.venv/bin/python -c 'import torch, ray, optuna, dspy; print("torch", torch.__version__, "ray", ray.__version__, "optuna", optuna.__version__, "dspy", dspy.__version__)')"
