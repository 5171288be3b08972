"""What opening the software settings (``allow: [software]``) is worth, and whether the search still finds the optimum.

    .venv/bin/python benchmarks/bench_software.py [EXPERIMENT ...] [--seeds 5] [--budget 30] [--out FILE.json]

For each experiment (bundled names or YAML paths; default: the bundled NVIDIA and AMD MoE experiments, Llama 3.1 70B
and the suite2 cases docs/search.md lists): the legal points of its space and of the same space with the software
group open, the enumeration time of the latter, both exact optima (branch and bound, the simulate oracle), and
seed_llm's regret against the software optimum after 15 and 30 trials over ``--seeds`` seeds, with the search wall
time per seed. Wall-clock seconds on a shared machine; the point counts, optima and regrets do not depend on it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT = ["qwen3-30b-a3b-b200-8", "gpt-oss-120b-b200-64", "qwen3-235b-a22b-gb200-256", "llama3.1-70b-h100-64",
           "mixtral-8x22b-mi355x-4node", "experiments/suite2/dbrx-h200-64.yaml",
           "experiments/suite2/mixtral-8x7b-h100-32.yaml", "experiments/suite2/llama4-maverick-gb200-256.yaml",
           "experiments/suite2/deepseek-v2-lite-h200-16.yaml", "experiments/suite2/gpt-oss-20b-a100-16.yaml",
           "experiments/suite2/qwen3-30b-a3b-mi300x-8.yaml", "experiments/suite2/llama3.1-8b-h100-8.yaml"]


def measure(name: str, seeds: int, budget: int) -> dict:
    from searchers.driver import exhaustive_optimum, run_search
    from searchers.evaluator import OracleEvaluator
    from searchers.experiment import load_experiment

    ev = OracleEvaluator("simulate")
    exp = load_experiment(name)
    sw = exp.with_changes(allow=tuple(dict.fromkeys([*exp.allow, "software"])))
    default = exhaustive_optimum(exp.space, ev, jobs=0)
    t = time.perf_counter()
    size = sw.space.size
    enum_s = time.perf_counter() - t
    opt = exhaustive_optimum(sw.space, ev, jobs=0)
    best = opt["tokens_per_s_per_gpu"]
    at15, at30 = [], []
    t = time.perf_counter()
    for seed in range(seeds):
        curve = run_search(sw, "seed_llm", budget, seed, evaluator=ev).best_so_far
        at15.append(100 * (1 - curve[min(14, len(curve) - 1)] / best))
        at30.append(100 * (1 - curve[-1] / best))
    return {"experiment": exp.name, "points": exp.space.size, "points_software": size, "enumeration_s": enum_s,
            "optimum": default["tokens_per_s_per_gpu"], "optimum_software": best,
            "gain": best / default["tokens_per_s_per_gpu"], "regret_15_median": statistics.median(at15),
            "regret_30_median": statistics.median(at30), "regret_30_max": max(at30),
            "search_s_per_seed": (time.perf_counter() - t) / seeds,
            "winner_software": {k: v for k, v in opt["config"].items() if k in sw.space.axes and k not in exp.space.axes
                                or k == "moe_a2a_backend"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", default=DEFAULT)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args()
    from oracle.collector import tune_bulk_process
    tune_bulk_process()
    rows = []
    print(f"{'experiment':<30} {'points':>8} {'+software':>10} {'enum s':>7} {'optimum':>9} {'+software':>10} "
          f"{'gain':>6}   seed_llm regret % @15 / @30 (median, max)   s/seed")
    for name in args.experiments:
        r = measure(name, args.seeds, args.budget)
        rows.append(r)
        print(f"{r['experiment']:<30} {r['points']:>8,} {r['points_software']:>10,} {r['enumeration_s']:>7.1f} "
              f"{r['optimum']:>9,.0f} {r['optimum_software']:>10,.0f} {100 * (r['gain'] - 1):>+5.1f}%   "
              f"{r['regret_15_median']:.1f} / {r['regret_30_median']:.1f}, {r['regret_30_max']:.1f}"
              f"{'':>22}{r['search_s_per_seed']:>6.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
