"""Projections per second on one core (simulate mode), over random legal points of a search space.

    python benchmarks/bench_projection.py [--n 400] [--seed 0]

Spaces: Mixtral 8x22B on 32 MI355X (the paper's Sec. 4.7 case) and DeepSeek V3 on 1,024 MI355X.
Prints rates (projections/s) for full projections (memory + time) in search mode
(``fast_schedules=True``, as searchers call it), split by whether the point uses a
cost-aware schedule (ilp / V greedy), and memory-only pre-filter rates. Caches are cleared before
each space so the rates include first-time layer pricing.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle.config import RunConfig  # noqa: E402
from oracle.memory import project_memory  # noqa: E402
from oracle.projector import project  # noqa: E402
from searchers.space import SearchSpace  # noqa: E402

SPACES = {
    "mixtral-8x22b / 32 x mi355x": {"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                    "training": {"seq_len": 8192, "gbs": 512, "pp": 4, "vpp": 2, "ep": 8}},
    "deepseek-v3 / 1024 x mi355x": {"model": "deepseek-v3", "cluster": {"hardware": "mi355x", "num_gpus": 1024},
                                    "training": {"seq_len": 4096, "gbs": 4096, "mbs": 2, "pp": 8, "ep": 8,
                                                 "precision": "fp8", "decoder_first_pipeline_num_layers": 5,
                                                 "decoder_last_pipeline_num_layers": 8}},
}
COST_AWARE = {"ilp", "zbv_greedy", "v_half", "v_min"}


def rate(fn, runs) -> tuple[str, int]:
    t0 = time.perf_counter()
    for r in runs:
        fn(r)
    dt = time.perf_counter() - t0
    v = len(runs) / dt if dt else float("inf")
    return (f"{v:8.1f} /s" if v < 10 else f"{v:8.0f} /s"), len(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm", type=int, default=1500,
                    help="other random points projected (untimed) before the steady-state sample: a long search "
                         "has compiled the pipeline plan of every (schedule, pp, vpp, m) it meets (default 1500)")
    args = ap.parse_args()
    for name, spec in SPACES.items():
        t0 = time.perf_counter()
        space = SearchSpace(RunConfig.from_dict(spec))
        pts = space.points
        enum_s = time.perf_counter() - t0
        rng = random.Random(args.seed)
        sample = [space.run_of(p) for p in rng.sample(pts, min(args.n, len(pts)))]
        plain = [r for r in sample if r.training.schedule not in COST_AWARE]
        fresh = [space.run_of(p) for p in rng.sample(pts, min(args.n, len(pts)))]
        fresh = [r for r in fresh if r.training.schedule not in COST_AWARE]
        warm = [space.run_of(p) for p in rng.sample(pts, min(args.warm, len(pts)))]
        warm = [r for r in warm if r.training.schedule not in COST_AWARE]
        aware = [r for r in sample if r.training.schedule in COST_AWARE][:20]
        print(f"== {name}: {len(pts):,} legal points (enumerated in {enum_s:.2f} s); sample {len(sample)}")
        r_mem, n_mem = rate(project_memory, sample)
        print(f"   memory-only pre-filter        {r_mem}  (n={n_mem})")
        r_fast, n_fast = rate(lambda r: project(r, fast_schedules=True, memory_tree=False), plain)
        print(f"   full projection, fixed-order schedules, cold (first (pp,vpp,m) plans compiled)  {r_fast}  (n={n_fast})")
        if aware:
            r_aw, n_aw = rate(lambda r: project(r, fast_schedules=True, memory_tree=False), aware)
            print(f"   full projection, cost-aware schedules (ilp/greedy V), search mode  {r_aw}  (n={n_aw})")
        for r in warm:
            project(r, fast_schedules=True, memory_tree=False)
        r_rep, n_rep = rate(lambda r: project(r, fast_schedules=True, memory_tree=False), fresh)
        print(f"   full projection, new points after {len(warm):,} others (steady state of a long search)  {r_rep}  "
              f"(n={n_rep})")
        # the same points again: every (schedule, pp, vpp, m) pipeline plan is compiled now, so this is the
        # per-projection cost alone (layer pricing, comm, memory, the compiled-order simulation)
        r_warm, n_warm = rate(lambda r: project(r, fast_schedules=True, memory_tree=False), fresh)
        print(f"   full projection, pipeline plans warm (per-projection cost)    {r_warm}  (n={n_warm})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
