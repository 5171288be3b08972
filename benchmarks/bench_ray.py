"""Ray throughput and overhead, simulate mode: what docs/ray.md records.

    .venv/bin/python benchmarks/bench_ray.py [--experiment llama3.1-70b-h100-64] [--points 1200] [--budget 30]

1. Bulk scoring of the same candidates (pre-filter + projection, the real simulate oracle): in-process,
   then a ScoringPool with 1 and 2 workers (batches of at most --batch), and 2 workers fed one candidate
   per call; two passes each (cold caches, then warm), in evaluations/s and as a ratio to in-process,
   with the load average after each path and the CPU seconds the pool's actors and the driver used
   (the work, whatever the load: 2 workers reach 2x on two idle cores only if it does not grow).
2. The Tune path: a --budget trial search (random searcher) as Ray Tune trials, one at a time, against
   the same search in-process; the fixed cost of a ``tuner.fit()`` (actors, Tune start-up, first trial
   actor) and the steady per-trial wall time, with the ratio per-trial / in-process-per-candidate.

Embedded local Ray with --cpus CPUs (default: all). Numbers move with machine load: run it on a quiet box.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bulk(exp, points: int, batch: int) -> list[tuple[str, float, float]]:
    """(path, cold evals/s, warm evals/s) per path: the first pass fills the oracle's caches (kernel and
    communication models per shape), the second pass over the same candidates finds them warm."""
    import ray

    from raytune_primus.pool import ScoringPool, score_in_process
    from searchers.evaluator import OracleEvaluator

    ev = OracleEvaluator("simulate")
    allp = list(exp.space.iter_values())  # each point with its derived pipeline layout (as the space runs it)
    step = max(1, len(allp) // points)
    cands = allp[::step][:points]

    def two_passes(fn) -> tuple[float, float, list]:
        rates, out = [], None
        for _ in range(2):
            t = time.perf_counter()
            out = fn(cands)
            rates.append(len(cands) / (time.perf_counter() - t))
        return rates[0], rates[1], out

    cold, warm, ref = two_passes(lambda c: score_in_process(ev, exp.space.baseline, c, prefilter=True))
    rows = [("in-process (1 core)", cold, warm, os.getloadavg()[0], None)]
    for workers, bsz in ((1, batch), (2, batch), (2, 1)):
        with ScoringPool(ev, exp.space.baseline, num_actors=workers, batch_size=bsz) as pool:
            def cpu() -> float:  # CPU seconds of the actors and this driver: what the work costs, load aside
                return sum(ray.get([a.cpu_s.remote() for a in pool.actors])) + time.process_time()
            c0 = cpu()
            cold, warm, got = two_passes(pool.evaluate)
            cpu_s = cpu() - c0
        assert got == ref, "pool results differ from in-process results"
        rows.append((f"pool, {workers} worker{'s' if workers > 1 else ''}, batch <= {bsz}", cold, warm,
                     os.getloadavg()[0], cpu_s))
    return rows


def tune_overhead(exp, budget: int) -> dict[str, float]:
    from raytune_primus.tuner import run_tune
    from searchers.driver import run_search
    from searchers.ledger import read_rows

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run_search(exp, "random", budget, 0, Path(tmp) / "inproc.parquet")
        inproc = (time.perf_counter() - t) / budget
        t = time.perf_counter()
        out = run_tune(exp, Path(tmp) / "ray", searcher="random", budget=budget, seed=0, max_concurrent=1,
                       progress=False)
        total = time.perf_counter() - t
        rows = sorted((r for r in read_rows(Path(tmp) / "ray" / "ledger.parquet") if r["trial_index"] >= 0),
                      key=lambda r: r["finished_at"])
    ends = [r["finished_at"].timestamp() for r in rows]
    steady = (ends[-1] - ends[0]) / max(1, len(ends) - 1)
    fixed = total - steady * len(ends)
    return {"trials": out.trials, "total_s": total, "fixed_s": fixed, "per_trial_s": steady,
            "inprocess_per_candidate_s": inproc, "ratio": steady / inproc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="llama3.1-70b-h100-64")
    ap.add_argument("--points", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--budget", type=int, default=30, help="Tune-path trials (0: bulk scoring only)")
    ap.add_argument("--cpus", type=int, default=None)
    args = ap.parse_args()

    from raytune_primus.runtime import init_ray
    from searchers.experiment import load_experiment

    exp = load_experiment(args.experiment)
    t = time.perf_counter()
    init_ray("local", num_cpus=args.cpus)
    print(f"embedded Ray up in {time.perf_counter() - t:.1f} s ({os.cpu_count()} cores here, load average "
          f"{os.getloadavg()[0]:.1f} before the run); experiment {exp.name}, {exp.space.size} legal points")
    print(f"\n1. bulk scoring, {args.points} candidates (memory pre-filter + simulate projection), evals/s")
    rows = bulk(exp, args.points, args.batch)
    base = rows[0][2]
    print(f"   {'path':<32} {'cold':>9} {'warm':>9}   warm vs in-process   load after   CPU s (actors + driver)")
    for name, cold, warm, load, cpu_s in rows:
        print(f"   {name:<32} {cold:9,.0f} {warm:9,.0f}   x{warm / base:<18.2f} {load:<12.1f}"
              f"{'' if cpu_s is None else f'{cpu_s:.2f}'}")
    one, two = rows[1], rows[2]
    print(f"   2 workers vs 1 worker (batches): cold x{two[1] / one[1]:.2f}, warm x{two[2] / one[2]:.2f} "
          f"(wall-clock rates: meaningful only with two idle cores, see the load); CPU for the same work "
          f"x{two[4] / one[4]:.2f}")
    if args.budget <= 0:
        return 0
    o = tune_overhead(exp, args.budget)
    print(f"\n2. Tune path, {args.budget} trials one at a time (reuse_actors=True)")
    print(f"   fixed cost of a fit (actors, Tune, first trial actor)  {o['fixed_s']:.1f} s")
    print(f"   steady wall time per trial                            {1e3 * o['per_trial_s']:.0f} ms")
    print(f"   in-process time per candidate                          {1e3 * o['inprocess_per_candidate_s']:.1f} ms")
    print(f"   per-trial / in-process                                 x{o['ratio']:.1f}")
    print(f"   whole fit                                              {o['total_s']:.1f} s")
    print(f"\nload average after the run: {os.getloadavg()[0]:.1f} (other processes skew every number above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
