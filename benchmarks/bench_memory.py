"""Resident memory of a long run of projections: does it stay bounded (issue 13, item 5)?

    python benchmarks/bench_memory.py [--n 100000] [--experiment mixtral-8x22b-mi355x-4node] [--seed 0]

Scores ``n`` random legal points of an experiment's space (drawn with replacement, as a long search
revisits shapes) with the simulate oracle as searchers call it (``OracleEvaluator``: memory pre-filter,
then the projection), and prints the process's resident memory (RSS) every ``n/10`` projections and the
growth after warm-up (the first tenth fills the oracle's size-limited caches). Every cache on this
path has a size limit (``functools.lru_cache(maxsize=...)``, the component registry's 256 entries),
so the growth after warm-up should be near zero; a steady climb means an unbounded cache.
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from searchers.evaluator import OracleEvaluator, memory_result, score_result  # noqa: E402
from searchers.experiment import load_experiment  # noqa: E402


def rss_mib() -> float:
    """Resident set size of this process in MiB (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            import os
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import psutil
        return psutil.Process().memory_info().rss / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="projections (default 100,000)")
    ap.add_argument("--experiment", default="mixtral-8x22b-mi355x-4node")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    exp = load_experiment(args.experiment)
    points = exp.space.points
    rng = random.Random(args.seed)
    ev = OracleEvaluator("simulate", fast_schedules=True)
    step = max(1, args.n // 10)
    print(f"{args.experiment}: {len(points):,} legal points, {args.n:,} projections (drawn with replacement)")
    print(f"{'projections':>12} {'RSS MiB':>9} {'proj/s':>8} {'rejected':>9}")
    start_mib = rss_mib()
    marks: list[tuple[int, float]] = [(0, start_mib)]
    rejected = 0
    t0 = time.perf_counter()
    for i in range(1, args.n + 1):
        run = exp.space.run_of(rng.choice(points))
        key = run.key()
        res = memory_result(ev, run, key)
        if res is None:
            res = score_result(ev, run, key)
        else:
            rejected += 1
        if i % step == 0 or i == args.n:
            gc.collect()
            mib = rss_mib()
            marks.append((i, mib))
            print(f"{i:>12,} {mib:>9.1f} {i / (time.perf_counter() - t0):>8.0f} {rejected:>9,}")
    warm_i, warm_mib = marks[1] if len(marks) > 2 else marks[0]
    half_i, half_mib = marks[len(marks) // 2]
    end_i, end_mib = marks[-1]
    per_10k = (end_mib - half_mib) / max(1, end_i - half_i) * 10_000
    # the caches fill in steps (an lru_cache grows until its maxsize), so the second half is the test
    print(f"start {start_mib:.1f} MiB; after {warm_i:,} projections {warm_mib:.1f} MiB; after {half_i:,} "
          f"{half_mib:.1f} MiB; end {end_mib:.1f} MiB: growth over the second half {end_mib - half_mib:+.1f} MiB "
          f"({per_10k:+.2f} MiB per 10,000 projections)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
