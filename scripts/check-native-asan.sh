#!/usr/bin/env bash
# Memory-safety check of the C extension (oracle/pipeline/_native.c): build it with AddressSanitizer in a
# throw-away copy of the tracked files and run its tests there (the bit-identity properties, the byte-for-byte
# plan comparisons, the garbage-input test) plus bench_validate under ASan. Needs gcc with libasan and the
# project's .venv (scripts/setup.sh). Not part of CI (minutes, and a sanitizer build); run it after changing the C.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
ASAN=$(gcc -print-file-name=libasan.so)
[ -e "$ASAN" ] || { echo "no libasan for this gcc: cannot run the check" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$tmp"
cd "$tmp"
sha=$(sha256sum oracle/pipeline/_native.c | cut -d' ' -f1)
ext=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
gcc -O1 -g -fsanitize=address -fno-omit-frame-pointer -shared -fPIC -DNATIVE_SOURCE_SHA256="\"$sha\"" -I"$inc" \
    oracle/pipeline/_native.c -o "oracle/pipeline/_native$ext"
export ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$ASAN" PYTHONPATH="$tmp"
"$PY" -c "from oracle.pipeline import _jit; assert _jit.extension() is not None, 'the ASan build did not load'"
"$PY" -m pytest -q -p no:cacheprovider tests/oracle/test_pipeline_fast_compile.py tests/oracle/test_pipeline_jit.py \
    tests/oracle/test_pipeline_frontier.py
"$PY" benchmarks/bench_validate.py | tail -1
echo "ASan: no report"
