"""Pipeline simulator throughput: simulations per second for pp=8, m=64 (not a test; prints a table).

    .venv/bin/python benchmarks/bench_pipeline.py [--seconds 1.0]

"cached" is what the oracle's search loop pays per call of run_schedule (the op order is built and
compiled once per (schedule, pp, vpp, m) and reused); "cold" rebuilds and recompiles every time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle.pipeline import StageCosts, build_order, get_schedule, run_schedule, simulate  # noqa: E402

CASES = (("1f1b", 1), ("interleaved", 4), ("zbv", 2), ("zero_bubble", 1), ("v_min", 2))


def rate(fn, seconds: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=64)
    args = ap.parse_args()
    pp, m = args.pp, args.microbatches
    print(f"pp={pp}, num_microbatches={m}")
    print(f"{'schedule':12s} {'vpp':>3s} {'ops':>6s} {'cached sims/s':>14s} {'cold sims/s':>12s}")
    for name, vpp in CASES:
        costs = StageCosts.uniform(pp=pp, vpp=vpp, f_s=1.0 / vpp, b_s=1.1 / vpp, w_s=0.9 / vpp, p2p_s=0.02)
        layout = get_schedule(name).layout
        order = build_order(name, pp, vpp, m)
        spec = get_schedule(name)
        cached = rate(lambda: run_schedule(name, pp, vpp, m, costs), args.seconds)
        cold = rate(lambda: simulate(spec.make(pp, vpp, m).order, pp, vpp, layout, m, costs), args.seconds)
        print(f"{name:12s} {vpp:3d} {sum(map(len, order)):6d} {cached:14.0f} {cold:12.0f}")


if __name__ == "__main__":
    main()
