"""``raytune-primus e2e-cpu``: benchmark-mode projections from a 1-process benchmark vs real multi-process runs.

1. calibrate a profile of this machine with one core per "device" (``hardware calibrate``: kernels, and
   the gloo link between two processes) - or take one given with --profile;
2. in rounds, for each configuration: benchmark its layer types in ONE process with one thread
   (oracle.benchmark), then run the real trainer (raytune_primus.e2e.trainer: DDP, pipelining 1F1B, EP
   all-to-all over gloo), and project it from that single-process benchmark (benchmark) and from the
   kernel model alone (simulate);
4. report measured vs projected tokens/s, the error, and whether the projections rank the runs as measured.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from raytune_primus.e2e.trainer import TrainJob

SEQ_LEN = 256
BASE = {"seq_len": SEQ_LEN, "mbs": 1, "tp": 1, "use_distributed_optimizer": False, "recompute": "none",
        "pp_schedule": "1f1b"}


def jobs(profile: str, *, iterations: int = 8, stat: str = "median", seq_len: int = SEQ_LEN) -> list[TrainJob]:
    """The end-to-end configurations: 1 process, DP=2 (DDP), PP=2 (1F1B), and the MoE card with EP=2."""
    def cfg(model: str, gpus: int, **tr: Any) -> dict[str, Any]:
        return {"model": model, "cluster": {"hardware": profile, "num_gpus": gpus},
                "training": {**BASE, "seq_len": seq_len, **tr}}
    return [
        TrainJob(name="dense 1 proc", config=cfg("tiny-dense", 1, gbs=4), iterations=iterations, stat=stat),
        TrainJob(name="dense DP=2", config=cfg("tiny-dense", 2, gbs=8, overlap_grad_reduce=True), iterations=iterations, stat=stat),
        TrainJob(name="dense PP=2 1F1B", config=cfg("tiny-dense", 2, gbs=8, pp=2), iterations=iterations, stat=stat),
        TrainJob(name="moe EP=2", config=cfg("tiny-moe", 2, gbs=8, ep=2, overlap_grad_reduce=False),
                 iterations=iterations, stat=stat),
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


def run_e2e(*, profile: str | None = None, cache_dir: str | None = None, use_cache: bool = True,
            repeats: int = 9, iterations: int = 8, stat: str = "median", rounds: int = 3, seq_len: int = SEQ_LEN,
            log=print) -> dict[str, Any]:
    """Paired rounds: in every round each run's layers are benchmarked in this one process immediately
    before the run itself, and the run is projected from that benchmark, so a machine whose speed drifts
    (a shared or virtual host) shifts both sides of a pair alike. Per run the round with the fastest
    measurement is reported with its own projection (other work only ever slows a round); every round's
    error is kept in ``round_errors``.

    ``stat`` is taken within a benchmark (of a layer's repeats) and within a run (of its iterations) alike:
    an iteration is a sum of many ops, so a statistic of whole iterations compares with the same statistic of
    each op, not with each op's luckiest repeat (the sum of per-op minima undershoots any real iteration).
    The layer timings are always measured afresh (a pair needs its own); ``cache_dir`` keeps them, and
    ``use_cache=False`` writes none."""
    import torch

    from oracle.benchmark.source import BenchmarkSource
    from oracle.benchmark.timing import pin_to_core
    from oracle.config import RunConfig
    from oracle.projector import project
    from raytune_primus.e2e.trainer import run_job

    t_all = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="e2e_cpu_"))
    calibration = None
    if profile is None:
        import yaml

        from oracle.benchmark.calibrate import calibrate
        log("calibrating a 1-core-per-device profile of this machine (kernels, gloo link between 2 processes) ...")
        data, raw = calibrate(base="cpu-host", name="cpu-core", world=2, threads=1, device="cpu")
        path = work / "cpu-core.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        profile = str(path)
        calibration = raw
        log(f"  link: {raw['links']['latency_s'] * 1e6:,.0f} us, {raw['links']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, "
            f"{raw['links']['collective_launch_s'] * 1e6:,.0f} us per collective; "
            f"bf16 GEMM {raw['kernels']['gemm_bf16_flops'] / 1e9:,.0f} GFLOP/s")
    todo = jobs(profile, iterations=iterations, stat=stat, seq_len=seq_len)
    runs = [RunConfig.from_dict(job.config) for job in todo]
    threads = torch.get_num_threads()
    pairs: dict[str, list[dict[str, Any]]] = {job.name: [] for job in todo}
    for rnd in range(rounds):
        for job, run in zip(todo, runs):
            torch.set_num_threads(1)  # one device = one core, as each trainer process
            affinity = os.sched_getaffinity(0)
            pin_to_core(0)
            try:
                # a fresh measurement per pair (the cache is written, not read: an old timing is no pair)
                src = BenchmarkSource(benchmark_gpus=1, bencher_options={
                    "cache_dir": cache_dir, "use_cache": use_cache, "refresh": True, "repeats": repeats,
                    "warmup": 3, "stat": stat, "device": "cpu", "per_op": False})
                log(f"round {rnd + 1}/{rounds}: benchmarking the layers of {job.name} in this one process (1 thread) ...")
                timings = {spec.key(): src.get(spec) for spec in src.specs(run).values()}
            finally:
                torch.set_num_threads(threads)
                os.sched_setaffinity(0, affinity)
            log(f"round {rnd + 1}/{rounds}: running {job.name} ({job.world} process{'es' if job.world > 1 else ''}) ...")
            res = run_job(job)
            bench = BenchmarkSource(benchmark_gpus=1, timings=timings, measure=False).project(run)
            pairs[job.name].append({"measured": res, "benchmark": bench})
    rows = []
    for job, run in zip(todo, runs):
        n = run.cluster.num_gpus
        rounds_ = pairs[job.name]
        best = max(rounds_, key=lambda p: p["measured"]["tokens_per_s"])
        m, bench = best["measured"], best["benchmark"]
        sim = project(run, mode="simulate")
        rows.append({"name": job.name, "config": _short(job.config), "processes": job.world,
                     "measured_tokens_per_s": m["tokens_per_s"],
                     "benchmark_projected": bench.tokens_per_s_per_gpu * n,
                     "simulate_projected": sim.tokens_per_s_per_gpu * n,
                     "measured_iteration_s": m["iteration_s"],
                     "measured_iteration_times_s": [t for p in rounds_ for t in p["measured"]["iteration_times_s"]],
                     "round_errors": [p["benchmark"].tokens_per_s_per_gpu * n / p["measured"]["tokens_per_s"] - 1
                                      for p in rounds_],
                     "benchmark_iteration_s": bench.iteration_time_s, "simulate_iteration_s": sim.iteration_time_s})
    for r in rows:
        r["benchmark_error"] = r["benchmark_projected"] / r["measured_tokens_per_s"] - 1
        r["simulate_error"] = r["simulate_projected"] / r["measured_tokens_per_s"] - 1
    meas = [r["measured_tokens_per_s"] for r in rows]
    out = {"runs": rows, "profile": profile, "calibration": calibration, "rounds": rounds, "statistic": stat,
           "pairing": "each run with the benchmark measured just before it, in the same round; the fastest round",
           "benchmark_same_ranking": _rank(meas) == _rank([r["benchmark_projected"] for r in rows]),
           "simulate_same_ranking": _rank(meas) == _rank([r["simulate_projected"] for r in rows]),
           "benchmark_max_abs_error": max(abs(r["benchmark_error"]) for r in rows),
           "seconds": time.perf_counter() - t_all}
    return out


def e2e_text(res: dict[str, Any]) -> str:
    lines = [f"{'run':<18} {'config':<44} {'measured tok/s':>14} {'benchmark':>10} {'err':>7} {'simulate':>10} {'err':>7}"]
    for r in res["runs"]:
        lines.append(f"{r['name']:<18} {r['config']:<44} {r['measured_tokens_per_s']:>14,.0f} "
                     f"{r['benchmark_projected']:>10,.0f} {100 * r['benchmark_error']:>+6.1f}% "
                     f"{r['simulate_projected']:>10,.0f} {100 * r['simulate_error']:>+6.1f}%")
    lines.append(f"benchmark: max |error| {100 * res['benchmark_max_abs_error']:.1f}%, same ranking as measured: "
                 f"{'yes' if res['benchmark_same_ranking'] else 'NO'}; simulate same ranking: "
                 f"{'yes' if res['simulate_same_ranking'] else 'NO'}  ({res['seconds']:.0f} s)")
    return "\n".join(lines)
