"""Benchmark-mode plumbing on logical GPUs: placement, one trial per device, a shared timing cache.

The cluster fixture's two worker nodes have one logical GPU each. The layer timer is a fake with
the :class:`raytune_primus.actors.LayerTimer` interface (the real one, oracle.benchmark.source.BenchmarkSource,
times torch layers; tests/oracle/test_benchmark*.py cover it): it sleeps per measurement and returns a
deterministic time per shape.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict

import pytest

pytestmark = pytest.mark.ray


def _shape_time(shape: str) -> float:
    return 1e-3 * (1 + sum(map(ord, shape)) % 97 / 97)


class FakeTimer:
    """Layer shapes from (tp, cp, mbs, precision); measuring one takes ``measure_s`` seconds."""

    mode = "benchmark"

    def __init__(self, measure_s: float = 0.15) -> None:
        self.measure_s = measure_s

    def shapes(self, run):
        t = run.training
        return [f"mlp|tp={t.tp}|mbs={t.mbs}|{t.precision}", f"attn|tp={t.tp}|cp={t.cp}|mbs={t.mbs}"]

    def measure(self, shape, gpu_ids):
        assert gpu_ids, "a benchmark scorer must hold a device"
        time.sleep(self.measure_s)
        return _shape_time(shape)

    def memory(self, run):
        from searchers.testing import SyntheticEvaluator
        return SyntheticEvaluator().memory(run)

    def project(self, run, timings):
        from searchers.testing import SyntheticEvaluator
        p = SyntheticEvaluator().score(run)
        layer_s = sum(timings[s] for s in self.shapes(run))
        return dataclasses.replace(p, tokens_per_s_per_gpu=p.tokens_per_s_per_gpu * 1e-3 / layer_s)


def test_one_trial_per_device_shared_cache_and_placement(cluster, small, tmp_path):
    import ray
    from ray.tune import ExperimentAnalysis

    from raytune_primus.trainable import build_run
    from raytune_primus.tuner import run_tune

    gpu_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}
    assert len(gpu_nodes) == 2
    timer = FakeTimer()
    out = run_tune(small, tmp_path, searcher="random", budget=12, seed=2, timer=timer, benchmark_gpus=1,
                   max_concurrent=4, progress=False)
    assert out.tune.max_concurrent == 2, "concurrency is capped at the number of devices"
    assert out.tune.scorers["exclusive"] and out.tune.scorers["scorers"] == 2 and out.tune.scorers["max_busy"] <= 2

    trials = [t.last_result for t in ExperimentAnalysis(out.tune.experiment_path).trials]
    assert trials and all(r["worker_gpus"] for r in trials)
    # placement: every device scorer sits on a GPU node, one per node
    devices = {(r["worker_node"], r["worker_gpus"]) for r in trials}
    assert {n for n, _ in devices} == gpu_nodes
    # one trial per device at a time: the lease intervals on one device never overlap
    by_device = defaultdict(list)
    for r in trials:
        by_device[(r["worker_node"], r["worker_gpus"])].append((r["leased_at"], r["returned_at"]))
    for spans in by_device.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))

    # the cache: every shape the scored trials needed was measured exactly once, across both devices
    runs = [build_run(small.space.baseline, json.loads(r["training_json"])) for r in trials]
    needed = {s for run in runs for s in timer.shapes(run)}
    cache = out.tune.timing_cache
    assert set(cache["measurements"]) == needed
    assert all(n == 1 for n in cache["measurements"].values()) and cache["repeats"] == 0
    assert cache["hits"] > 0, "later trials found shapes measured by earlier ones"

    # results equal the projection from those timings computed here
    for run, r in zip(runs, trials):
        if r["status"] == "ok":
            ref = timer.project(run, {s: _shape_time(s) for s in timer.shapes(run)})
            assert r["tokens_per_s_per_gpu"] == ref.tokens_per_s_per_gpu


def test_two_devices_asking_for_the_same_shapes_measure_each_once(cluster, small):
    import ray

    from raytune_primus.actors import kill_all, start_device_scorers

    timer = FakeTimer(measure_s=0.5)
    scorers, cache = start_device_scorers(timer, small.space.baseline, 2, gpus_per_scorer=1)
    try:
        where = ray.get([s.where.remote() for s in scorers])
        assert len({w["node_id"] for w in where}) == 2 and all(w["gpu_ids"] for w in where)
        point = small.space.point(0)
        a, b = ray.get([s.score.remote(point) for s in scorers])  # same shapes, at the same time
        assert a == b and a["status"] in ("ok", "rejected")
        stats = ray.get(cache.stats.remote())
        assert stats["repeats"] == 0 and len(stats["measurements"]) == 2
        measured = [ray.get(s.where.remote())["measured"] for s in scorers]
        assert sorted(len(m) for m in measured) in ([0, 2], [1, 1]), "the other device waited for them"
    finally:
        kill_all(scorers, cache)


def test_more_gpus_per_trial_than_the_cluster_has_is_an_error(cluster, small, tmp_path):
    from oracle.errors import BenchmarkError
    from raytune_primus.tuner import run_tune

    with pytest.raises(BenchmarkError, match="GPU"):
        run_tune(small, tmp_path, searcher="random", budget=2, timer=FakeTimer(), benchmark_gpus=3, progress=False)
    # without a timer, oracle_mode benchmark builds the real one (oracle.benchmark.source.BenchmarkSource)
    # and checks the same GPU budget before starting anything
    with pytest.raises(BenchmarkError, match="needs 3 GPU"):
        run_tune(small.with_changes(oracle_mode="benchmark"), tmp_path, budget=2, benchmark_gpus=3, progress=False)
