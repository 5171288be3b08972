"""Projections per second on one core (simulate mode), over random legal points of a search space.

    python benchmarks/bench_projection.py [--n 400] [--seed 0] [--warm 1500] [--spaces mixtral,deepseek]
                                          [--code ROOT] [--record FILE] [--reference FILE]

Spaces: Mixtral 8x22B on 32 MI355X (the paper's Sec. 4.7 case) and DeepSeek V3 on 1,024 MI355X.
Rates are projections per CPU second of this process (``time.process_time``: one core, and what other
work on a shared machine takes from it is not counted), for

- enumeration of the space's legal points (seconds);
- the memory-only pre-filter (``OracleEvaluator.memory``, what a search's pre-filter runs), one by one and as a
  batch (``OracleEvaluator.memory_peaks``: numpy over the configurations, what sweeps and the branch and bound run);
- full projections in search mode (``fast_schedules=True``, no memory tree) of fixed-order schedules:
  cold (first points: pipeline plans compiled, layers priced), steady (new points after ``--warm`` others:
  a long search), plans warm (the same points again);
- cost-aware schedules (ilp / greedy V) in search mode: ``--aware-n`` random points (the solver's import,
  ~1 s once per process, is done before timing), and consecutive points of a sweep (space order), where
  solved orders are shared between configurations with proportional costs;
- batch scoring (``project_many``) of a sweep: ``--n`` consecutive points in space order, as the exhaustive
  sweep and the branch-and-bound optimum score them, and of the steady sample.

Each rate is printed with its ratio to the reference file (default ``benchmarks/bench_projection_reference.json``:
the same benchmark run on the code before issue 27, ``--code`` pointing at that tree), where it holds one.
``--code ROOT`` imports the oracle from another source tree (A/B runs); ``--record FILE`` writes the rates.
``--jit auto|on|numba|off`` sets ``RAYTUNE_PRIMUS_JIT`` (the compiled pipeline replay, ``oracle/pipeline/_jit.py``:
the C extension ``oracle.pipeline._native`` where the install built it, else numba; default ``auto``: the C
extension from the first replay, else numba once a process has replayed 5M steps, the phase in which it loads
numba paying the 0.4-1.6 s; ``numba`` forces numba even where the C extension is built); each full-projection
rate says which replay it ran: ``[python]``, ``[native]``, ``[numba]`` (``[compiled]`` from a tree before the C
extension) or ``[switched: numba]`` (loaded during that phase, its load counted). With ``on`` or ``numba`` the
compiled replay is loaded before the first phase and its load printed on a line of its own (seconds, once per
process), as the ILP solver's import is: the cold rate is then the cost of new points, not of a process start
(before 2026-12-04 the cold phase paid it and read ``[switched]``; ``auto`` without the C extension shows what a
process that never switches pays).

Each phase starts after a full garbage collection (untimed), so none lands inside a phase by chance: one costs
~0.1 s once the oracle's caches hold ~270k objects, about a whole batch phase. A long search does pay them: over
4,500 new Mixtral points 2 full collections took 0.22-0.25 s of 2.6-3.0 s (~8 %; ``gc.callbacks``, Python's
thresholds), so the rates here are that much above a long search's. ``--gc bulk`` (the default) sets the
collector's thresholds as the command line and the Ray scorers do (``oracle/collector.py``: fewer young and
middle collections); ``--gc default`` keeps Python's, as every run before that module measured. ``--malloc bulk``
(the default) sets glibc's mmap and trim thresholds as they do too (``tune_allocator``: a new plan's arrays stop
faulting their pages in afresh); ``--malloc default`` keeps glibc's, as every run before 2026-12-04 measured.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPACES = {
    "mixtral-8x22b / 32 x mi355x": {"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                    "training": {"seq_len": 8192, "gbs": 512, "pp": 4, "vpp": 2, "ep": 8}},
    "deepseek-v3 / 1024 x mi355x": {"model": "deepseek-v3", "cluster": {"hardware": "mi355x", "num_gpus": 1024},
                                    "training": {"seq_len": 4096, "gbs": 4096, "mbs": 2, "pp": 8, "ep": 8,
                                                 "precision": "fp8", "decoder_first_pipeline_num_layers": 5,
                                                 "decoder_last_pipeline_num_layers": 8}},
}
COST_AWARE = {"ilp", "zbv_greedy", "v_half", "v_min"}
REFERENCE = HERE / "bench_projection_reference.json"


def draw(space, pts, *, n: int, warm: int, seed: int):
    """The benchmark's samples of a space, in one seeded order: (rng, sample, plain, fresh, warm) - ``n`` random
    points, those of them on fixed-order schedules, ``n`` other fixed-order points, and ``warm`` fixed-order
    points to warm the caches with; ``rng`` continues the draw (profile_projection.py profiles the same points)."""
    rng = random.Random(seed)
    sample = [space.run_of(p) for p in rng.sample(pts, min(n, len(pts)))]
    plain = [r for r in sample if r.training.schedule not in COST_AWARE]
    fresh = [space.run_of(p) for p in rng.sample(pts, min(n, len(pts)))]
    fresh = [r for r in fresh if r.training.schedule not in COST_AWARE]
    warmup = [space.run_of(p) for p in rng.sample(pts, min(warm, len(pts)))]
    warmup = [r for r in warmup if r.training.schedule not in COST_AWARE]
    return rng, sample, plain, fresh, warmup


_REPLAY = {"last": ""}  # which pipeline replay the last timed phase ran (trees with oracle.pipeline._jit)


def set_collector(choice: str) -> str:
    """Set the collector as the command line does (``bulk``: ``oracle.collector.tune_collector`` of the tree on
    the path) or leave Python's thresholds (``default``); returns a line saying which."""
    if choice == "bulk":
        try:
            from oracle.collector import tune_collector
        except ImportError:  # a tree from before oracle/collector.py
            return f"collector: Python's thresholds {gc.get_threshold()} (this tree has no oracle.collector)"
        tune_collector()
    return f"collector: thresholds {gc.get_threshold()} ({choice})"


def set_allocator(choice: str) -> str:
    """Set the C allocator's thresholds as the command line does (``bulk``: ``oracle.collector.tune_allocator`` of
    the tree on the path) or leave them (``default``); returns a line saying which."""
    if choice == "bulk":
        try:
            from oracle.collector import tune_allocator
        except ImportError:  # a tree from before tune_allocator
            return "allocator: the C library's thresholds (this tree has no oracle.collector.tune_allocator)"
        if tune_allocator():
            return "allocator: glibc mmap threshold 32 MiB, trim threshold 128 MiB (bulk)"
        return "allocator: the C library's thresholds (not glibc, or RAYTUNE_PRIMUS_MALLOC=default)"
    return "allocator: the C library's thresholds (default)"


def _load_jit_now() -> tuple[float, float, str] | None:
    """With ``RAYTUNE_PRIMUS_JIT=on`` (or ``numba``), load the compiled replay now: (CPU s, wall s) of the load and
    the replay it loaded; None where the mode is neither or the tree has no ``oracle.pipeline._jit``."""
    if os.environ.get("RAYTUNE_PRIMUS_JIT", "").strip().lower() not in ("on", "numba"):
        return None
    try:
        from oracle.pipeline import _jit
    except ImportError:
        return None
    t0, w0 = time.process_time(), time.perf_counter()
    _jit.compiled(0)
    return time.process_time() - t0, time.perf_counter() - w0, _replay()[1]


def _replay() -> tuple[bool | None, str]:
    """(whether the compiled replay is in use, which: ``native``, ``numba``, ``python``, or ``compiled`` for a tree
    from before the C extension); (None, "") before the oracle is imported."""
    mod = sys.modules.get("oracle.pipeline._jit")
    if mod is None:
        return None, ""
    on = mod._state["fn"] is not None
    return on, mod.backend() if hasattr(mod, "backend") else "compiled" if on else "python"


def _timed(fn, arg) -> float:
    before, _ = _replay()
    # a full collection first (untimed): with the space's points on the heap one costs ~0.1-0.2 s, and whether the
    # collector's counters reached one inside a 0.1 s phase swung the same tree's batch rates x1.7-2.6 between runs
    gc.collect()
    t0 = time.process_time()
    fn(arg)
    dt = time.process_time() - t0
    after, kind = _replay()
    _REPLAY["last"] = "" if after is None else f"[{kind}]" if before or not after or kind == "native" else f"[switched: {kind}]"
    return dt


def _rate(fn, items) -> float:
    def each(xs):  # results dropped as they come, as before: holding them would change the heap the GC walks
        for x in xs:
            fn(x)
    dt = _timed(each, items)
    return len(items) / dt if dt else float("inf")


def _batch_rate(fn, runs) -> float:
    dt = _timed(fn, runs)
    return len(runs) / dt if dt else float("inf")


def _show(label: str, value: float | None, ref: float | None, unit: str = "/s", n: int | None = None) -> None:
    if value is None:
        return
    v = f"{value:10.1f} {unit}" if value < 10 else f"{value:10.0f} {unit}"
    ratio = ""
    if ref:
        ratio = f"  x{value / ref:.2f} vs reference ({ref:,.1f})" if unit == "/s" else \
            f"  x{ref / value:.2f} faster than reference ({ref:,.1f} s)"
    replay = f"  {_REPLAY['last']}" if label.startswith(("full", "batch")) else ""
    print(f"   {label:58s}{v}{ratio}{'' if n is None else f'  (n={n})'}{replay}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm", type=int, default=1500,
                    help="other random points projected (untimed) before the steady-state sample: a long search "
                         "has compiled the pipeline plan of every (schedule, pp, vpp, m) it meets (default 1500)")
    ap.add_argument("--aware-n", type=int, default=20, help="random cost-aware points timed (default 20)")
    ap.add_argument("--aware-sweep", type=int, default=60,
                    help="cost-aware points of a sweep (space order) timed after the random ones (default 60)")
    ap.add_argument("--spaces", default="mixtral,deepseek", help="comma-separated prefixes of the spaces to run")
    ap.add_argument("--code", default=str(HERE.parent), help="source tree to import the oracle from (A/B runs)")
    ap.add_argument("--record", default=None, help="write the rates to this JSON file")
    ap.add_argument("--reference", default=str(REFERENCE), help="rates to print ratios against")
    ap.add_argument("--gc", choices=("bulk", "default"), default="bulk",
                    help="the collector's thresholds: the command line's (bulk, oracle/collector.py: what the product "
                         "runs) or Python's own (default)")
    ap.add_argument("--malloc", choices=("bulk", "default"), default="bulk",
                    help="the C allocator's thresholds: the command line's (bulk, oracle/collector.py) or glibc's own "
                         "(default)")
    ap.add_argument("--jit", choices=("auto", "on", "numba", "off"), default=None,
                    help="RAYTUNE_PRIMUS_JIT for this run (default: the environment's, else auto)")
    args = ap.parse_args()
    if args.jit:
        os.environ["RAYTUNE_PRIMUS_JIT"] = args.jit
    sys.path.insert(0, args.code)
    print(set_collector(args.gc))
    print(set_allocator(args.malloc))
    from oracle.config import RunConfig
    from oracle.projector import project
    from searchers.evaluator import OracleEvaluator
    from searchers.space import SearchSpace
    try:
        from oracle.projector import project_many
    except ImportError:  # a tree from before the batch API
        project_many = None
    ref_all = json.loads(Path(args.reference).read_text()) if Path(args.reference).exists() else {}
    recorded: dict[str, dict[str, float]] = {}
    ev = OracleEvaluator()
    jit_load = _load_jit_now()
    if jit_load is not None:
        print(f"   {f'compiled replay ({jit_load[2]}) loaded once, in no rate below':58s}{jit_load[0]:10.2f} s CPU"
              f"  ({jit_load[1]:.2f} s wall)")
    wanted = [w.strip() for w in args.spaces.split(",") if w.strip()]
    for name, spec in SPACES.items():
        if not any(name.startswith(w) for w in wanted):
            continue
        ref = ref_all.get(name, {})
        rates: dict[str, float] = {}
        t0 = time.process_time()
        space = SearchSpace(RunConfig.from_dict(spec))
        pts = space.points
        rates["enumerate_s"] = time.process_time() - t0
        rng, sample, plain, fresh, warm = draw(space, pts, n=args.n, warm=args.warm, seed=args.seed)
        aware_rng = random.Random(args.seed + 1)  # its own draw: the other samples stay as they were
        aware = [space.run_of(p) for p in aware_rng.sample(pts, min(20 * args.aware_n, len(pts)))]
        aware = [r for r in aware if r.training.schedule in COST_AWARE][:args.aware_n]
        start = rng.randrange(max(1, len(pts) - args.n))
        sweep = [space.run_of(p) for p in pts[start:start + args.n]]
        sweep = [r for r in sweep if r.training.schedule not in COST_AWARE]
        print(f"== {name}: {len(pts):,} legal points; sample {len(sample)} (CPU-time rates, one core)")
        _show("enumeration of the legal points", rates["enumerate_s"], ref.get("enumerate_s"), unit="s")
        rates["prefilter"] = _rate(ev.memory, sample)
        _show("memory-only pre-filter (first points: new shapes)", rates["prefilter"], ref.get("prefilter"),
              n=len(sample))
        rates["prefilter_warm"] = _rate(ev.memory, fresh)
        _show("memory-only pre-filter (other points, shapes known)", rates["prefilter_warm"],
              ref.get("prefilter_warm"), n=len(fresh))
        if hasattr(ev, "memory_peaks"):  # the batch pre-filter (numpy over the configurations)
            many = [space.run_of(p) for p in random.Random(args.seed + 1).sample(pts, min(10 * args.n, len(pts)))]
            rates["prefilter_batch"] = _batch_rate(ev.memory_peaks, many)
            _show("memory-only pre-filter, batch (memory_peaks), new points", rates["prefilter_batch"],
                  ref.get("prefilter_batch"), n=len(many))
            rates["prefilter_batch_again"] = _batch_rate(ev.memory_peaks, many)
            _show("memory-only pre-filter, batch, the same points again", rates["prefilter_batch_again"],
                  ref.get("prefilter_batch_again"), n=len(many))

        def one(r):
            return project(r, fast_schedules=True, memory_tree=False)
        rates["cold"] = _rate(one, plain)
        _show("full, fixed-order schedules, cold (plans compiled)", rates["cold"], ref.get("cold"), n=len(plain))
        if aware:
            import scipy.optimize  # noqa: F401  (the ILP's solver: a one-off import, not a per-projection cost)
            rates["cost_aware"] = _rate(one, aware)
            _show("full, cost-aware schedules (ilp/greedy V)", rates["cost_aware"], ref.get("cost_aware"),
                  n=len(aware))
            i = space.axes.index("pp_schedule")
            near = [space.run_of(p) for p in pts[start:] if p[i] in COST_AWARE][:args.aware_sweep]
            rates["cost_aware_sweep"] = _rate(one, near)
            _show("full, cost-aware, consecutive points of a sweep", rates["cost_aware_sweep"],
                  ref.get("cost_aware_sweep"), n=len(near))
        for r in warm:
            one(r)
        rates["steady"] = _rate(one, fresh)
        _show(f"full, new points after {len(warm):,} others (steady)", rates["steady"], ref.get("steady"),
              n=len(fresh))
        rates["plans_warm"] = _rate(one, fresh)
        _show("full, the same points again (plans warm)", rates["plans_warm"], ref.get("plans_warm"), n=len(fresh))
        if project_many is not None:
            def many(rs):
                return project_many(rs, fast_schedules=True, memory_tree=False)
            rates["batch_sweep"] = _batch_rate(many, sweep)
            _show("batch (project_many), consecutive points of a sweep", rates["batch_sweep"],
                  ref.get("batch_sweep"), n=len(sweep))
            rates["batch_steady"] = _batch_rate(many, fresh)
            _show("batch (project_many), the steady sample", rates["batch_steady"], ref.get("batch_steady"),
                  n=len(fresh))
        else:
            rates["batch_sweep"] = _rate(one, sweep)
            _show("one by one, consecutive points of a sweep", rates["batch_sweep"], ref.get("batch_sweep"),
                  n=len(sweep))
        recorded[name] = rates
    if args.record:
        Path(args.record).write_text(json.dumps(recorded, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
