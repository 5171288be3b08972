"""Wall time of an exact optimum (branch and bound) of a wide space, phase by phase, with 1 and N processes.

    python benchmarks/bench_optimum.py [--case maverick|mixtral|deepseek] [--jobs 1,0] [--limit N]

Cases: ``maverick`` (Llama 4 Maverick on 128 GB200-NVL72, every default axis of the search space open,
the numerics held at BF16: 2.2 million raw points), ``mixtral`` and ``deepseek`` (the suite's bundled specs). For each
``--jobs`` value (0 = every core) it prints the enumeration time of the legal points, then
``searchers.driver.exhaustive_optimum``'s phases: the memory check and throughput bound of every point
(the part split over processes), the projections in best-bound order, and the optimum, which must not
depend on the job count (checked). ``--limit N`` keeps the first N legal points (a quicker run).
Wall-clock seconds: other work on a shared machine inflates them; the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {
    "maverick": {"model": "llama4-maverick", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 128},
                 "training": {"seq_len": 8192, "gbs": 1024, "tp": 1, "pp": 4, "ep": 16, "precision": "bf16"}},
}


def _space(case: str):
    from oracle.config import RunConfig
    from searchers.experiment import load_experiment
    from searchers.space import SearchSpace
    if case == "mixtral":
        return load_experiment("mixtral-8x22b-mi355x-4node").space
    if case == "deepseek":
        return load_experiment("deepseek-v3-h100-1024").space
    return SearchSpace(RunConfig.from_dict(CASES[case]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="maverick", choices=["maverick", "mixtral", "deepseek"])
    ap.add_argument("--jobs", default="1,0", help="comma-separated process counts to time (0 = every core)")
    ap.add_argument("--limit", type=int, default=0, help="keep only the first N legal points (0: all)")
    args = ap.parse_args()
    from searchers.driver import _OPTIMA, cpu_jobs, exhaustive_optimum
    from searchers.evaluator import OracleEvaluator
    space = _space(args.case)
    print(f"== {args.case}: {space.raw_size:,} raw points over {len(space.axes)} axes; load {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    points = space.points
    print(f"   enumeration of the legal points: {len(points):,} in {time.perf_counter() - t0:.1f} s")
    if args.limit:
        space.__dict__["points"] = points[:args.limit]
        print(f"   kept the first {args.limit:,}")
    seen = None
    for j in [int(x) for x in args.jobs.split(",")]:
        _OPTIMA.clear()
        t0 = time.perf_counter()
        opt = exhaustive_optimum(space, OracleEvaluator(), jobs=j)
        wall = time.perf_counter() - t0
        ph = opt.get("phase_wall_s", {})
        print(f"   jobs={j} ({cpu_jobs(j)} processes): {wall:.1f} s  [memory checks + bounds "
              f"{ph.get('memory_and_bounds', float('nan')):.1f} s ({opt['space_size'] / max(ph.get('memory_and_bounds', 1e-9), 1e-9):,.0f} points/s), "
              f"projections {ph.get('projections', float('nan')):.1f} s for {opt.get('projected')}]  "
              f"optimum {opt['tokens_per_s_per_gpu'] or 0:,.1f} tokens/s/GPU of {opt['scored']:,} fitting; "
              f"load {os.getloadavg()[0]:.1f}")
        key = (opt["tokens_per_s_per_gpu"], opt["point"])
        if seen is not None and key != seen:
            print("   MISMATCH: the optimum depends on the job count")
            return 1
        seen = key
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
