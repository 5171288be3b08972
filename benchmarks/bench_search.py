"""Search wall time per searcher, split into oracle time and searcher overhead.

    python benchmarks/bench_search.py                                  # tiny experiment, synthetic oracle
    python benchmarks/bench_search.py mixtral-8x22b-mi355x-4node --oracle simulate --budget 30 --seeds 2

Prints, per searcher: trials (pre-filter rejections included), candidates handled (trials plus free
repeats and illegal proposals), wall time, candidates per second, and how much of the wall time went
into the oracle (memory pre-filter + projection) versus the searcher itself.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from searchers.base import available  # noqa: E402
from searchers.driver import default_evaluator, run_search  # noqa: E402
from searchers.experiment import load_experiment  # noqa: E402


class TimedEvaluator:
    """Wraps an evaluator and adds up the time spent in it."""

    def __init__(self, inner):
        self.inner, self.mode, self.oracle_s = inner, inner.mode, 0.0

    def _timed(self, call, run):
        t = time.perf_counter()
        try:
            return call(run)
        finally:
            self.oracle_s += time.perf_counter() - t

    def memory(self, run):
        return self._timed(self.inner.memory, run)

    def score(self, run):
        return self._timed(self.inner.score, run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiment", nargs="?", default="tiny-moe-h100-8")
    p.add_argument("--oracle", default="synthetic", choices=["synthetic", "simulate"])
    p.add_argument("--budget", type=int, default=30)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--searchers", nargs="+", default=None)
    args = p.parse_args(argv)
    exp = load_experiment(args.experiment)
    t = time.perf_counter()
    size = exp.space.size
    enum_s = time.perf_counter() - t
    print(f"{exp.name}: {size:,} legal points (enumerated in {enum_s:.2f} s), oracle {args.oracle}, "
          f"budget {args.budget}, seeds {args.seeds}")
    print(f"{'searcher':<10} {'trials':>7} {'candidates':>10} {'wall s':>8} {'cand/s':>8} {'oracle s':>9} "
          f"{'searcher s':>11}  best tokens/s/GPU (median)")
    for name in args.searchers or available():
        walls, cands, trials, oracle, bests = [], [], [], [], []
        for seed in range(args.seeds):
            ev = TimedEvaluator(default_evaluator(args.oracle))
            t = time.perf_counter()
            r = run_search(exp, name, args.budget, seed, evaluator=ev)
            wall = time.perf_counter() - t
            walls.append(wall)
            trials.append(r.trials)
            cands.append(r.trials + r.repeats + r.illegal)
            oracle.append(ev.oracle_s)
            bests.append(r.best_tokens_per_s_per_gpu or 0.0)
        w, c = statistics.median(walls), statistics.median(cands)
        o = statistics.median(oracle)
        print(f"{name:<10} {statistics.median(trials):>7.0f} {c:>10.0f} {w:>8.2f} {c / w:>8.1f} {o:>9.2f} "
              f"{max(0.0, w - o):>11.2f}  {statistics.median(bests):,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
