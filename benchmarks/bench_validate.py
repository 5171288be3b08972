"""``validate`` throughput on fresh configurations: rows per CPU second, start-up cancelled out (issue 27).

    python benchmarks/bench_validate.py [--n 401] [--seed 0] [--jobs 1]

Draws ``--n`` + 1 random legal points of the Mixtral 8x22B / 32 MI355X space of
``benchmarks/bench_projection.py`` (fixed-order schedules: ``validate`` projects in exact mode, where an
ILP row solves its MILP on exact costs), writes each as a validation row (the published-CSV columns, a
placeholder measurement), and times ``oracle.validate.validate_rows`` in this process: first on one
row (imports, model card, hardware profile: the start-up), then on the other ``--n`` rows, which no
earlier call has projected (fresh shapes, new pipeline plans), as the issue's figure was taken. Prints
the rows per second of CPU time of this process (``time.process_time``: one core; other sessions on a
shared machine take nothing from it) and of wall time. ``--jobs N``: validate's own process split
(wall time is then the figure; CPU time counts only this process).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_projection import COST_AWARE, SPACES, set_allocator, set_collector  # noqa: E402

ROW_KEYS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "precision", "fsdp", "use_distributed_optimizer", "recompute",
            "pp_schedule", "moe_a2a_backend")


def rows_of(n: int, seed: int) -> list[dict[str, str]]:
    from oracle.config import RunConfig
    from searchers.space import SearchSpace
    spec = SPACES["mixtral-8x22b / 32 x mi355x"]
    space = SearchSpace(RunConfig.from_dict(spec))
    rng = random.Random(seed)
    i = space.axes.index("pp_schedule")
    pts = [p for p in rng.sample(space.points, 4 * n) if p[i] not in COST_AWARE][:n]
    out = []
    for k, p in enumerate(pts):
        t = space.run_of(p).training
        row = {"id": f"bench-{k}", "source": "bench_validate", "group": "bench", "model": spec["model"],
               "hardware": spec["cluster"]["hardware"], "num_gpus": str(spec["cluster"]["num_gpus"]),
               "seq_len": str(t.seq_len), "gbs": str(t.gbs), "etp": "", "recompute_num_layers": "",
               "measured_tokens_per_s_per_gpu": "1000", "measured_tflops_per_gpu": "", "measured_peak_mem_gib": "",
               "quality": "A", "notes": ""}
        for key in ROW_KEYS:
            v = getattr(t, "schedule" if key == "pp_schedule" else key)
            row[key] = str(v).lower() if isinstance(v, bool) else str(v)
        out.append(row)
    return out


def _replay_backend() -> str:
    """The pipeline replay this process ran (``oracle/pipeline/_jit.py``; with ``--jobs`` > 1, the parent's)."""
    from oracle.pipeline import _jit
    return _jit.backend() if hasattr(_jit, "backend") else "compiled" if _jit._state["fn"] is not None else "python"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=401)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--gc", choices=("bulk", "default"), default="bulk",
                    help="the collector's thresholds: the command line's (bulk, oracle/collector.py) or Python's")
    ap.add_argument("--malloc", choices=("bulk", "default"), default="bulk",
                    help="the C allocator's thresholds: the command line's (bulk, oracle/collector.py) or glibc's")
    args = ap.parse_args()
    gc_line = f"{set_collector(args.gc)}; {set_allocator(args.malloc)}"
    rows = rows_of(args.n + 1, args.seed)
    from oracle.validate import validate_rows
    c0, w0 = time.process_time(), time.perf_counter()
    first = validate_rows(rows[:1])
    c1, w1 = time.process_time(), time.perf_counter()
    rest = validate_rows(rows[1:], jobs=args.jobs)
    c2, w2 = time.process_time(), time.perf_counter()
    done = [r for r in first + rest if r.skipped is None]
    n = len(rows) - 1
    print(f"validate, {n} fresh Mixtral 8x22B / 32 MI355X rows ({len(done)} of {len(rows)} projected, "
          f"jobs={args.jobs}); load {os.getloadavg()[0]:.1f}; {gc_line}; replay: {_replay_backend()}")
    print(f"   start-up (one row): {c1 - c0:.2f} s CPU, {w1 - w0:.2f} s wall")
    print(f"   {n} rows: {n / (c2 - c1):,.0f} rows per CPU second ({1e3 * (c2 - c1) / n:.2f} ms each), "
          f"{n / (w2 - w1):,.0f} rows per wall second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
