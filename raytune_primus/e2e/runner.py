"""``raytune-primus e2e-cpu``: benchmark-mode projections from a 1-process benchmark vs real multi-process runs.

1. pick the compute dtype this CPU runs natively (bf16 with AVX512-BF16/AMX, else fp32: oracle.benchmark.dtype);
   benchmark, trainer and calibration all use it;
2. wait (up to ``wait_s``) for a machine without other load (oracle.benchmark.load), refusing to measure on a
   busy one unless ``allow_busy``;
3. calibrate a profile of this machine with one core per "device" (``hardware calibrate``: kernels, and
   the gloo link between two processes) - or take one given with --profile;
4. in paired rounds sized to a time budget, for each configuration: benchmark its layer types in ONE process
   with one thread (oracle.benchmark), then run the real trainer (raytune_primus.e2e.trainer: Megatron-style DDP,
   pipelining 1F1B, EP all-to-all over gloo), and project it from that single-process benchmark (benchmark) and
   from the kernel model alone (simulate); a pair measured while other processes used the machine is measured
   again after a wait for quiet, or flagged;
5. report measured vs projected tokens/s, the error, whether the projections rank the runs as measured, the
   load seen, and the verdict against the bar (every run within BAR_ERROR of measured, ranked as measured).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from oracle.benchmark.load import BUSY_LIMIT_CORES, LoadMonitor, LoadSeen
from oracle.errors import PrimusError
from raytune_primus.e2e.trainer import TrainJob

SEQ_LEN = 256
BASE = {"seq_len": SEQ_LEN, "mbs": 1, "tp": 1, "use_distributed_optimizer": False, "recompute": "none",
        "pp_schedule": "1f1b"}
BAR_ERROR = 0.20
"""The check's bar (issue 26, docs/benchmark.md): every run's benchmark projection within 20% of measured."""
BUDGET_S = 240.0
"""Default seconds for calibration and the paired rounds (waits for quiet not included): with start-up and the
dtype probe, under 5 minutes on a 2-core machine."""
WAIT_S = 120.0
"""Default seconds, in all, to wait for a quiet machine (before starting and before re-measuring a busy pair)."""
MIN_ITERATIONS = 3
"""Fewest timed trainer iterations per run (a median of fewer is a guess)."""
SPAWN_GUESS_S = 6.0
"""Start-up of a trainer run before its first iteration (processes, torch import, gloo) until one is measured:
4-7 s on the 2-core AVX2 host."""


class BusyMachine(PrimusError):
    """The machine had other load when e2e-cpu had to measure, and waiting did not help."""


class TrainerFailed(PrimusError):
    """A trainer run's processes died twice in a row."""


def _run_trainer(trainer: Any, job: TrainJob, label: str, log: Any) -> dict[str, Any]:
    """One trainer run; a run whose processes die (a gloo worker aborting at exit, seen in EP runs on the 2-core
    machine while the trainer still ran a collective there) is no measurement: it is run once more, and a
    second death stops the check."""
    for attempt in (1, 2):
        try:
            return trainer.run_job(job)
        except Exception as exc:  # torch.multiprocessing's ProcessExitedException and the like
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'}"
            if attempt == 2:
                raise TrainerFailed(f"{job.name}: the trainer's processes died twice ({why}); rerun e2e-cpu, "
                                    f"or run that configuration alone to see its output") from exc
            log(f"{label}: the trainer's processes died ({why}): running it again")
    raise AssertionError("unreachable")


def jobs(profile: str, *, iterations: int = 8, stat: str = "median", seq_len: int = SEQ_LEN,
         dtype: str = "bf16") -> list[TrainJob]:
    """The end-to-end configurations: 1 process, DP=2 (Megatron-style DDP), PP=2 (1F1B), and the MoE card with
    EP=2, computing in ``dtype`` (fp32: the gradients DDP and the EP trainer reduce are fp32, which the projection
    prices)."""
    extra = {"grad_reduce_in_fp32": True} if dtype == "fp32" else {}

    def cfg(model: str, gpus: int, **tr: Any) -> dict[str, Any]:
        return {"model": model, "cluster": {"hardware": profile, "num_gpus": gpus},
                "training": {**BASE, "seq_len": seq_len, **extra, **tr}}
    kw = dict(iterations=iterations, stat=stat, dtype=dtype)
    return [
        TrainJob(name="dense 1 proc", config=cfg("tiny-dense", 1, gbs=4), **kw),
        TrainJob(name="dense DP=2", config=cfg("tiny-dense", 2, gbs=8, overlap_grad_reduce=False), **kw),
        TrainJob(name="dense PP=2 1F1B", config=cfg("tiny-dense", 2, gbs=8, pp=2), **kw),
        TrainJob(name="moe EP=2", config=cfg("tiny-moe", 2, gbs=8, ep=2, overlap_grad_reduce=False), **kw),
    ]


def _short(config: dict[str, Any]) -> str:
    t = config["training"]
    keys = ("tp", "pp", "ep", "gbs", "mbs", "seq_len")
    return f"{config['model']} x{config['cluster']['num_gpus']} " + " ".join(f"{k}={t.get(k, 1)}" for k in keys)


def _rank(xs: list[float]) -> list[int]:
    order = sorted(range(len(xs)), key=lambda i: -xs[i])
    r = [0] * len(xs)
    for pos, i in enumerate(order):
        r[i] = pos
    return r


def ranking_resolved(rows: list[dict[str, Any]], key: str) -> tuple[bool, list[list[str]]]:
    """Whether ``key`` orders every pair of runs the measurement orders, and the pairs it does not order (ties).
    A pair is ordered by the measurement when its runs' measured ranges over the rounds do not overlap: within
    them the rounds measured both orders, so either projected order agrees with what was measured. With one
    round the ranges are points and every pair with different measurements is ordered (the strict ranking)."""
    ok, ties = True, []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            lo_a, hi_a = a.get("measured_range_tokens_per_s") or [a["measured_tokens_per_s"]] * 2
            lo_b, hi_b = b.get("measured_range_tokens_per_s") or [b["measured_tokens_per_s"]] * 2
            if lo_a > hi_b:
                ok = ok and a[key] > b[key]
            elif lo_b > hi_a:
                ok = ok and b[key] > a[key]
            else:
                ties.append([a["name"], b["name"]])
    return ok, ties


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def size_iterations(*, left_s: float, pairs_left: int, projected_iteration_s: float, warmup: int,
                    overhead_s: float, most: int) -> int:
    """Timed iterations for the next run: its pair's share of the time left (``left_s`` over the ``pairs_left``
    pairs still to do, this one included) less a pair's overhead (benchmark, process start-up) and warm-up, at the
    projected iteration time; between MIN_ITERATIONS and ``most``."""
    share = left_s / max(1, pairs_left) - overhead_s
    fit = int(share / max(projected_iteration_s, 1e-9)) - warmup
    return max(MIN_ITERATIONS, min(most, fit))


def run_e2e(*, profile: str | None = None, cache_dir: str | None = None, use_cache: bool = True,
            repeats: int = 9, iterations: int = 8, stat: str = "median", rounds: int = 3, seq_len: int = SEQ_LEN,
            budget_s: float = BUDGET_S, wait_s: float = WAIT_S, allow_busy: bool = False,
            busy_limit_cores: float = BUSY_LIMIT_CORES, dtype: str = "auto", log=print) -> dict[str, Any]:
    """Paired rounds: in every round each run's layers are benchmarked in this one process immediately
    before the run itself, and the run is projected from that benchmark, so a machine whose speed drifts
    (a shared or virtual host) shifts both sides of a pair alike. Per run the median over its quiet rounds of
    the measured and of the projected tokens/s is reported (a benchmark disturbed in one round moves it no more
    than a disturbed run); every round's error is kept in ``round_errors``. Ranked as measured: every pair of runs
    whose measured ranges over the rounds do not overlap is projected in the measured order
    (:func:`ranking_resolved`); the strict order of the medians is reported too.

    Work is sized to ``budget_s`` (calibration and rounds; waits for quiet excluded): up to ``rounds`` rounds, as
    many as fit after the first, each run timed for up to ``iterations`` iterations (at least MIN_ITERATIONS), as
    many as its share of the budget allows at the iteration time its benchmark projects.

    Others' load is read from the kernel's CPU accounting around every measurement (oracle.benchmark.load). Before
    starting and whenever a pair saw more than ``busy_limit_cores`` of other load, the runner waits for quiet
    (``wait_s`` in all) and measures that pair again while the budget lasts; a machine that never goes quiet
    raises BusyMachine, unless ``allow_busy`` (then busy pairs are used and the result is flagged).

    ``stat`` is taken within a benchmark (of a layer's repeats) and within a run (of its iterations) alike:
    an iteration is a sum of many ops, so a statistic of whole iterations compares with the same statistic of
    each op, not with each op's luckiest repeat (the sum of per-op minima undershoots any real iteration).
    The layer timings are always measured afresh (a pair needs its own); ``cache_dir`` keeps them, and
    ``use_cache=False`` writes none."""
    import torch

    from oracle.benchmark.dtype import choose_dtype
    from oracle.benchmark.source import BenchmarkSource, dtype_speedup
    from oracle.benchmark.timing import pin_to_core
    from oracle.config import RunConfig
    from oracle.projector import project
    from raytune_primus.e2e import trainer

    t_all = time.perf_counter()
    todo = jobs(profile or "cpu-host", iterations=iterations, stat=stat, seq_len=seq_len)
    mon = LoadMonitor(limit_cores=busy_limit_cores, need_cores=max(job.world for job in todo))
    waited = [0.0]

    def quiet(why: str, required: bool = True) -> LoadSeen | None:
        """Wait (within what is left of wait_s) for a quiet machine; the last idle window. A machine that stays
        busy stops the check when ``required`` (before anything is measured)."""
        seen, w = mon.wait_for_quiet(max(0.0, wait_s - waited[0]), log=log)
        waited[0] += w
        if required and seen is not None and seen.busy and not allow_busy:
            raise BusyMachine(f"machine busy {why}: {seen.text()}, after waiting {waited[0]:.0f} s of --wait "
                              f"{wait_s:.0f}; e2e-cpu numbers measured under other load are no check - rerun when "
                              f"the machine is idle, or pass --allow-busy to measure anyway (results flagged)")
        return seen

    def used() -> float:
        return time.perf_counter() - t_all - waited[0]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the dtype a one-core device runs natively
    try:
        choice = choose_dtype(torch.device("cpu"), dtype)
    finally:
        torch.set_num_threads(threads)
    log(f"compute dtype: {choice.note()}")
    start = quiet("before starting")
    if start is not None:
        log(f"machine load before starting: {start.text()}")
    work = Path(tempfile.mkdtemp(prefix="e2e_cpu_"))
    calibration = None
    if profile is None:
        import yaml

        from oracle.benchmark.calibrate import calibrate
        for attempt in (1, 2):
            log(f"[{_clock(used())}] calibrating a 1-core-per-device profile of this machine in {choice.dtype} "
                "(kernels, gloo link between 2 processes) ...")
            data, raw = calibrate(base="cpu-host", name="cpu-core", world=2, threads=1, device="cpu",
                                  dtype=choice.dtype, monitor=mon)
            if not raw["busy"] or allow_busy or attempt == 2:
                break
            log(f"  calibration measured under other load ({data['sources']['load']}): measuring it again")
            quiet("before re-calibrating")
        if raw["busy"] and not allow_busy:
            raise BusyMachine(f"machine busy while calibrating twice ({data['sources']['load']}): e2e-cpu numbers "
                              f"measured under other load are no check - rerun when the machine is idle, or pass "
                              f"--allow-busy")
        path = work / "cpu-core.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        profile = str(path)
        calibration = raw
        log(f"  link: {raw['links']['latency_s'] * 1e6:,.0f} us, {raw['links']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, "
            f"{raw['links']['collective_launch_s'] * 1e6:,.0f} us per collective; "
            f"{choice.dtype} GEMM {raw['kernels']['gemm_flops'] / 1e9:,.0f} GFLOP/s; {data['sources']['load']}")
    todo = jobs(profile, iterations=iterations, stat=stat, seq_len=seq_len, dtype=choice.dtype)
    runs = [RunConfig.from_dict(job.config) for job in todo]
    reprice = dtype_speedup(runs[0], choice.dtype)
    reprice_note = "" if reprice == 1.0 else (
        f"profile {runs[0].cluster.hardware.name} prices bf16 at {reprice:.3g}x the {choice.dtype} rate the trainer "
        f"computes in, so the projections re-price the measured layers and the trainer does not: calibrate the "
        f"profile in {choice.dtype} (the default) for a like-for-like check")
    if reprice_note:
        log(f"warning: {reprice_note}")
    pairs: dict[str, list[dict[str, Any]]] = {job.name: [] for job in todo}
    spawn_s = SPAWN_GUESS_S
    round_s: list[float] = []
    done_rounds, stop = 0, ""
    for rnd in range(rounds):
        if rnd and round_s and used() + max(round_s) > budget_s:
            stop = (f"{rnd} round(s) of {rounds} fit the {budget_s:.0f} s budget (a round took up to "
                    f"{max(round_s):.0f} s, {used():.0f} s used)")
            log(f"[{_clock(used())}] {stop}")
            break
        t_round = time.perf_counter()
        for k, (job, run) in enumerate(zip(todo, runs)):
            label = f"[{_clock(used())}/{_clock(budget_s)}] round {rnd + 1}/{rounds} {job.name}"
            for attempt in (1, 2):
                affinity = os.sched_getaffinity(0)
                torch.set_num_threads(1)  # one device = one core, as each trainer process
                pin_to_core(0)
                a = mon.mark()
                try:
                    # a fresh measurement per pair (the cache is written, not read: an old timing is no pair)
                    src = BenchmarkSource(benchmark_gpus=1, bencher_options={
                        "cache_dir": cache_dir, "use_cache": use_cache, "refresh": True, "repeats": repeats,
                        "warmup": 3, "stat": stat, "device": "cpu", "per_op": False, "dtype": choice.dtype})
                    log(f"{label}: benchmarking its layers in this one process (1 thread, {choice.dtype}) ...")
                    t_bench = time.perf_counter()
                    timings = {spec.key(): src.get(spec) for spec in src.specs(run).values()}
                    bench_s = time.perf_counter() - t_bench
                finally:
                    torch.set_num_threads(threads)
                    os.sched_setaffinity(0, affinity)
                bench = BenchmarkSource(benchmark_gpus=1, timings=timings, measure=False).project(run)
                pairs_left = (rounds - rnd) * len(todo) - k
                n_it = size_iterations(left_s=budget_s - used() + bench_s, pairs_left=pairs_left,
                                       projected_iteration_s=bench.iteration_time_s, warmup=job.warmup,
                                       overhead_s=spawn_s + bench_s, most=iterations)
                log(f"{label}: running it ({job.world} process{'es' if job.world > 1 else ''}, {n_it} iterations "
                    f"of ~{bench.iteration_time_s:.2f} s projected) ...")
                t_run = time.perf_counter()
                res = _run_trainer(trainer, dataclasses.replace(job, iterations=n_it), label, log)
                run_wall = time.perf_counter() - t_run
                spawn_s = max(1.0, run_wall - (job.warmup + n_it) * res["iteration_s"])
                seen = mon.since(a)
                n = run.cluster.num_gpus
                err = bench.tokens_per_s_per_gpu * n / res["tokens_per_s"] - 1
                log(f"{label}: measured {res['tokens_per_s']:,.0f} tok/s, benchmark {bench.tokens_per_s_per_gpu * n:,.0f} "
                    f"({100 * err:+.1f}%); {seen.text() if seen else 'load unknown'}")
                pair = {"measured": res, "benchmark": bench, "load": seen.to_dict() if seen else None,
                        "busy": bool(seen and seen.busy), "round": rnd + 1}
                if not pair["busy"] or allow_busy or attempt == 2 or used() + run_wall * 2 > budget_s:
                    break
                pairs[job.name].append(pair)  # kept in round_errors, never reported as the measurement
                log(f"{label}: measured under other load: waiting for quiet and measuring it again")
                quiet(f"during {job.name}", required=False)
            pairs[job.name].append(pair)
        round_s.append(time.perf_counter() - t_round)
        done_rounds = rnd + 1
    rows = []
    for job, run in zip(todo, runs):
        n = run.cluster.num_gpus
        rounds_ = pairs[job.name]
        usable = [p for p in rounds_ if not p["busy"]] or (rounds_ if allow_busy else [])
        if not usable:
            raise BusyMachine(f"machine busy in every round of {job.name} ({rounds_[-1]['load']['other_cores']:.2f} "
                              f"cores of other load last): e2e-cpu numbers measured under other load are no check - "
                              f"rerun when the machine is idle, or pass --allow-busy")
        # the median over the quiet rounds of each side: one disturbed side of a pair (a slow benchmark as much
        # as a slow run) moves neither; the measured spread over the rounds is what the ranking can resolve
        measured = [p["measured"]["tokens_per_s"] for p in usable]
        sim = project(run, mode="simulate")
        rows.append({"name": job.name, "config": _short(job.config), "processes": job.world,
                     "measured_tokens_per_s": statistics.median(measured),
                     "measured_range_tokens_per_s": [min(measured), max(measured)],
                     "benchmark_projected": statistics.median(p["benchmark"].tokens_per_s_per_gpu * n
                                                              for p in usable),
                     "simulate_projected": sim.tokens_per_s_per_gpu * n,
                     "measured_iteration_s": statistics.median(p["measured"]["iteration_s"] for p in usable),
                     "measured_iteration_times_s": [t for p in rounds_ for t in p["measured"]["iteration_times_s"]],
                     "round_errors": [p["benchmark"].tokens_per_s_per_gpu * n / p["measured"]["tokens_per_s"] - 1
                                      for p in rounds_],
                     "round_busy": [p["busy"] for p in rounds_],
                     "round_load_other_cores": [p["load"]["other_cores"] if p["load"] else None for p in rounds_],
                     "reported_rounds": [p["round"] for p in usable],
                     "reported_busy": any(p["busy"] for p in usable),
                     "reported_load_other_cores": max((p["load"]["other_cores"] for p in usable if p["load"]),
                                                      default=None),
                     "benchmark_iteration_s": statistics.median(p["benchmark"].iteration_time_s for p in usable),
                     "simulate_iteration_s": sim.iteration_time_s})
    for r in rows:
        r["benchmark_error"] = r["benchmark_projected"] / r["measured_tokens_per_s"] - 1
        r["simulate_error"] = r["simulate_projected"] / r["measured_tokens_per_s"] - 1
    meas = [r["measured_tokens_per_s"] for r in rows]
    same = _rank(meas) == _rank([r["benchmark_projected"] for r in rows])
    resolved, ties = ranking_resolved(rows, "benchmark_projected")
    worst = max(abs(r["benchmark_error"]) for r in rows)
    busy = any(r["reported_busy"] for r in rows) or bool(calibration and calibration["busy"])
    # a run that measured further apart over its quiet rounds than the bar's tolerance cannot check it: the
    # machine's speed moved (a virtual host's neighbours are not in its CPU accounting), not the projection
    spreads = [r["measured_range_tokens_per_s"][1] / r["measured_range_tokens_per_s"][0] - 1 for r in rows]
    spread = max(spreads)
    spread_run = rows[spreads.index(spread)]["name"]
    unstable = spread > BAR_ERROR
    verdict = ("NOT VALID (measured under other load)" if busy else
               f"NOT VALID (machine speed unstable: {spread_run} measured {100 * spread:.0f}% apart over its quiet "
               f"rounds, more than the {BAR_ERROR:.0%} the bar allows)" if unstable else
               "PASS" if worst <= BAR_ERROR and resolved else "FAIL")
    out = {"runs": rows, "profile": profile, "calibration": calibration, "rounds": done_rounds,
           "rounds_asked": rounds, "rounds_note": stop, "statistic": stat,
           "compute_dtype": choice.to_dict(), "profile_dtype_note": reprice_note,
           "pairing": "each run with the benchmark measured just before it, in the same round; per run the median "
                      "over its quiet rounds of each side",
           "benchmark_same_ranking": same, "benchmark_ranking_resolved": resolved,
           "simulate_ranking_resolved": ranking_resolved(rows, "simulate_projected")[0],
           "measured_ties": ties, "measured_max_spread": spread,
           "simulate_same_ranking": _rank(meas) == _rank([r["simulate_projected"] for r in rows]),
           "benchmark_max_abs_error": worst,
           "bar": f"every run within {BAR_ERROR:.0%} of measured, ranked as measured (every pair the rounds order)",
           "verdict": verdict,
           "load": {"before": start.to_dict() if start else None, "measured": mon.summary(),
                    "waited_s": waited[0], "allow_busy": allow_busy},
           "budget_s": budget_s, "seconds_measuring": used(),
           "seconds": time.perf_counter() - t_all}
    return out


def e2e_text(res: dict[str, Any]) -> str:
    lines = [f"{'run':<18} {'config':<44} {'measured tok/s':>14} {'range':>13} {'benchmark':>10} {'err':>7} "
             f"{'simulate':>10} {'err':>7} {'rounds':>6} {'load':>5}"]
    for r in res["runs"]:
        load = r.get("reported_load_other_cores")
        lo, hi = r.get("measured_range_tokens_per_s") or [r["measured_tokens_per_s"]] * 2
        lines.append(f"{r['name']:<18} {r['config']:<44} {r['measured_tokens_per_s']:>14,.0f} "
                     f"{f'{lo:,.0f}-{hi:,.0f}':>13} "
                     f"{r['benchmark_projected']:>10,.0f} {100 * r['benchmark_error']:>+6.1f}% "
                     f"{r['simulate_projected']:>10,.0f} {100 * r['simulate_error']:>+6.1f}% "
                     f"{len(r.get('reported_rounds', [])):>6} {'?' if load is None else f'{load:.2f}':>5}"
                     + ("  BUSY" if r.get("reported_busy") else ""))
    ties = res.get("measured_ties") or []
    tie_text = "; ".join(" = ".join(t) for t in ties)
    lines.append(f"benchmark: max |error| {100 * res['benchmark_max_abs_error']:.1f}%, ranked as measured: "
                 f"{'yes' if res.get('benchmark_ranking_resolved', res['benchmark_same_ranking']) else 'NO'}"
                 + (f" (within the measured spread over the rounds, not ordered by the measurement: {tie_text}; "
                    f"strict order of the medians {'also' if res['benchmark_same_ranking'] else 'NOT'} the same)"
                    if ties else "")
                 + f"; simulate ranked as measured: "
                 f"{'yes' if res.get('simulate_ranking_resolved', res['simulate_same_ranking']) else 'NO'}")
    if res.get("compute_dtype"):
        lines.append(f"dtype: {res['compute_dtype']['note']}")
    if res.get("profile_dtype_note"):
        lines.append(f"warning: {res['profile_dtype_note']}")
    load = res.get("load") or {}
    m = load.get("measured")
    if m:
        lines.append(f"load (others' CPU use, cores; 'load' column: the most over the run's quiet rounds): max "
                     f"{m['max_other_cores']:.2f}, mean {m['mean_other_cores']:.2f} over {m['intervals']} measurements, "
                     f"{m['busy_intervals']} above the {m['limit_cores']:.2f} limit; waited {load['waited_s']:.0f} s for quiet")
    if res.get("rounds_note"):
        lines.append(f"rounds: {res['rounds_note']}")
    lines.append(f"e2e-cpu: {res.get('verdict', '?')} (bar: {res.get('bar', '')}); {res.get('rounds', 0)} round(s), "
                 f"{res.get('seconds_measuring', res['seconds']):.0f} s measuring, {res['seconds']:.0f} s in all")
    return "\n".join(lines)
