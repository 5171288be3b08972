"""Long form of the input fuzz suite (tests/test_fuzz_inputs.py): many more cases per input kind.

Every input file kind (config, config with an inline model card, experiment spec, hardware profile,
model card (transformer and hybrid Mamba), Hugging Face config.json (dense, MLA, nested, wrapped, hybrid), validation
CSV, a config's recipe section,
and what is typed: a Megatron-LM launch line for ``--megatron-args`` and ``--set`` overrides) is mutated by
hypothesis as in
``tests/fuzzing.py`` and fed to the CLI in-process and to its library parser. Failures do not stop
the run: each is recorded with the case that caused it, and the distinct ones (by exception and place)
are printed at the end with the number of cases tried.

    python benchmarks/fuzz_inputs.py                       # 400 cases per kind, derandomized
    python benchmarks/fuzz_inputs.py --examples 2000 --random --kinds config csv

Exit code 1 when any case failed.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzzing import kinds, run_case  # noqa: E402


def _where(exc: BaseException) -> str:
    """The innermost frame of the project's code (oracle/, searchers/, raytune_primus/) that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    cause = exc.__cause__
    if cause is not None:
        frames = traceback.extract_tb(cause.__traceback__) or frames
    ours = [f for f in frames if any(p in f.filename for p in ("/oracle/", "/searchers/", "/raytune_primus/"))]
    f = (ours or frames or [None])[-1]
    return f"{Path(f.filename).name}:{f.lineno} {f.name}" if f else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=400, help="cases per input kind (default 400)")
    p.add_argument("--kinds", nargs="+", help="only these kinds (default: all)")
    p.add_argument("--random", action="store_true", help="random cases instead of the derandomized sequence")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    all_kinds = kinds()
    names = args.kinds or sorted(all_kinds)
    unknown = [n for n in names if n not in all_kinds]
    if unknown:
        p.error(f"unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(sorted(all_kinds))}")
    total, failed_total = 0, 0
    distinct: dict[str, tuple[int, str]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            kind = all_kinds[name]
            failures: list[str] = []
            t = time.perf_counter()

            @settings(max_examples=args.examples, deadline=None, derandomize=not args.random, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(st.data())
            def fuzz(data: st.DataObject) -> None:
                try:
                    run_case(kind, data, Path(tmp))
                except Exception as exc:  # recorded, not raised: the run goes on
                    inner = exc.__cause__ or exc
                    sig = f"{type(inner).__name__} at {_where(exc)}"
                    failures.append(sig)
                    n, first = distinct.get(sig, (0, f"{exc!s:.400}"))
                    distinct[sig] = (n + 1, first)

            try:
                fuzz()
            except Exception as exc:  # hypothesis itself gave up on this kind: say so, go on
                failures.append(f"hypothesis: {type(exc).__name__}")
                distinct[f"hypothesis {type(exc).__name__} ({name})"] = (1, f"{exc!s:.400}")
            total += kind.tried
            failed_total += len(failures)
            print(f"{name:<20} {kind.tried:>6} cases  {kind.results:>5} results  {kind.tried - kind.results:>5} errors "
                  f"{len(failures):>4} failed  {time.perf_counter() - t:6.1f} s", flush=True)
    print(f"{'all':<20} {total:>6} cases  {failed_total:>4} failed  {time.perf_counter() - t0:6.1f} s\n"
          "(results: exit 0; errors: exit 2 with error lines; failed: a traceback, another exit code, a long line, "
          "or a library error outside PrimusError)")
    for sig, (n, first) in sorted(distinct.items(), key=lambda kv: -kv[1][0]):
        print(f"\n{n} x {sig}\n  {first}")
    return 1 if failed_total else 0


if __name__ == "__main__":
    raise SystemExit(main())
