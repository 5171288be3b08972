#!/usr/bin/env bash
# Install Megatron-Core, Megatron-Bridge and TorchTitan (exact pins: scripts/frameworks.txt) into .frameworks/
# for tests/frameworks/, which builds the frameworks' own config objects from our exports (docs/frameworks.md).
# Idempotent: does nothing when .frameworks/ already holds these pins. pip --target with --no-deps: the venv
# (and its torch) is never touched; --ignore-requires-python because Megatron declares Python >= 3.12 and only
# its config classes are read here. Not fatal to the test suite: without .frameworks/ those tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIR=${RAYTUNE_PRIMUS_FRAMEWORKS:-.frameworks}
PINS=scripts/frameworks.txt
if [ -f "$DIR/frameworks.txt" ] && cmp -s "$PINS" "$DIR/frameworks.txt"; then
  echo "frameworks: up to date in $DIR"
  exit 0
fi
start=$(date +%s)
rm -rf "$DIR.partial"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --ignore-requires-python --no-compile \
  --target "$DIR.partial" -r "$PINS" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
cp "$PINS" "$DIR/frameworks.txt"  # the stamp tests/frameworks/frameworks.py compares with the pins
echo "frameworks: installed $(grep -c '^[a-z]' "$PINS") packages into $DIR in $(( $(date +%s) - start )) s"
