"""Bulk scoring over the node pool: placement on every node, batches, results equal to in-process."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.raytune_primus.conftest import SmallCapEvaluator

pytestmark = pytest.mark.ray


def test_actors_are_placed_on_every_node(cluster, tiny):
    import ray

    from raytune_primus.pool import ScoringPool
    from searchers.testing import SyntheticEvaluator

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) >= 3
    with ScoringPool(SyntheticEvaluator(), tiny.space.baseline, num_actors=len(nodes)) as pool:
        where = pool.placement()
    assert {w["node_id"] for w in where} == nodes, "SPREAD puts one actor on each node"


def test_batched_scores_equal_in_process_scores(cluster, tiny):
    from raytune_primus.pool import ScoringPool, score_in_process
    from searchers.evaluator import OracleEvaluator

    points = list(tiny.space.iter_points())[::8]  # ~120 points of the real simulate oracle
    ev = OracleEvaluator("simulate")
    ref = score_in_process(ev, tiny.space.baseline, points, prefilter=True)
    with ScoringPool(ev, tiny.space.baseline, num_actors=3, batch_size=25) as pool:
        got = pool.evaluate(points)
        order, batches, prefer = pool.plan(points)
        assert pool.calls == len(batches) >= 6 and sorted(order) == list(range(len(points)))
        assert set(prefer) == {0, 1, 2}, "every actor gets its own shard"
        assert sum(w["calls"] for w in pool.placement()) == len(points)
    assert got == ref
    assert all(r.status == "ok" for r in got)


def test_memory_prefilter_in_bulk_matches_in_process(cluster, tiny):
    from raytune_primus.pool import ScoringPool
    from searchers.evaluator import memory_result

    ev = SmallCapEvaluator()
    points = list(tiny.space.iter_points())
    with ScoringPool(ev, tiny.space.baseline, num_actors=2, batch_size=400) as pool:
        verdicts = pool.memory(points)
    expected = []
    for p in points:
        run = tiny.space.run_of(p)
        expected.append(memory_result(ev, run, run.key()))
    assert verdicts == expected
    rejected = sum(v is not None for v in verdicts)
    assert 0 < rejected < len(points)


def test_sweep_optimum_equals_the_in_process_exhaustive_optimum(cluster, small):
    from raytune_primus.pool import ScoringPool
    from raytune_primus.pool import sweep_optimum
    from searchers.driver import exhaustive_optimum

    ev = SmallCapEvaluator(cap_bytes=1.58 * 2**30)
    ref = exhaustive_optimum(small.space, ev)
    with ScoringPool(ev, small.space.baseline, num_actors=3, batch_size=7) as pool:
        got = sweep_optimum(pool, small.space)
    keys = ("tokens_per_s_per_gpu", "space_size", "scored", "point", "config")
    assert {k: got[k] for k in keys} == {k: ref[k] for k in keys}


def test_sweep_optimum_runs_the_branch_and_bound_on_the_pool(cluster):
    """With the real oracle (a throughput bound) the pool's sweep is the in-process branch and bound, its
    memory checks and bounds on the actors: the same optimum, point, candidate count and bound, and only
    a few projections; ``ScoringPool.bounds`` gives each candidate's memory verdict and bound as in-process."""
    from raytune_primus.pool import ScoringPool
    from raytune_primus.pool import sweep_optimum
    from searchers.driver import _OPTIMA, exhaustive_optimum
    from searchers.evaluator import OracleEvaluator, memory_result
    from searchers.experiment import load_experiment

    exp = load_experiment("llama3.1-70b-h100-64").with_changes(  # 4,752 points, about half over the cap
        name="llama70b-bnb", restrict={"tp": [2, 4, 8], "pp": [2, 4, 8], "mbs": [1, 2, 4]}, pins={})
    ev = OracleEvaluator("simulate")
    _OPTIMA.clear()
    ref = exhaustive_optimum(exp.space, ev, jobs=1)
    _OPTIMA.clear()
    some = exp.space.points[::37]
    with ScoringPool(ev, exp.space.baseline, num_actors=2) as pool:
        got = sweep_optimum(pool, exp.space)
        bounds = pool.bounds([exp.space.values_of(p) for p in some])
        best, fitting = pool.optimum(exp.space)
    keys = ("tokens_per_s_per_gpu", "space_size", "scored", "point", "config", "method",
            "upper_bound_tokens_per_s_per_gpu")
    assert {k: got[k] for k in keys} == {k: ref[k] for k in keys}
    assert got["method"] == "branch-and-bound" and got["actors"] == 2
    assert 0 < got["projected"] < got["scored"] / 10
    assert best.value == ref["tokens_per_s_per_gpu"] and best.training == ref["config"] and fitting == ref["scored"]
    expected = [None if memory_result(ev, r, "") is not None else ev.throughput_bound(r)
                for r in (exp.space.run_of(p) for p in some)]
    assert bounds == expected and any(b is None for b in bounds) and any(b is not None for b in bounds)


def _square(x: int) -> int:
    return x * x


def _nap_then_pid(seconds: float) -> int:
    import os
    import time
    time.sleep(seconds)
    return os.getpid()


def test_the_last_item_waits_for_the_actor_that_frees_first(cluster, tiny):
    """Behind a running call, an item is queued only while the driver's queue holds one per actor: the last one
    goes to whichever actor ends first. Actor 0 owns four 1-s items, actor 1 one 0.1-s item; actor 1 ends at once
    and steals item 3, then at 1.1 s item 2, which actor 0 (two calls queued, then one at 1 s with one item left)
    would otherwise have run after item 1, ending at 3 s instead of 2."""
    from raytune_primus.pool import ScoringPool
    from searchers.testing import SyntheticEvaluator

    with ScoringPool(SyntheticEvaluator(), tiny.space.baseline, num_actors=2) as pool:
        pids = [w["pid"] for w in pool.placement()]
        got = pool._dispatch(lambda a, s: a.call.remote(_nap_then_pid, s), [1.0, 1.0, 1.0, 1.0, 0.1],
                             splittable=False, on_failure=lambda item, why: None, prefer=[0, 0, 0, 0, 1], depth=2)
    assert got[:2] == [pids[0], pids[0]] and got[4] == pids[1]
    assert got[3] == pids[1], "stolen from the end of actor 0's queue by idle actor 1"
    assert got[2] == pids[1], "the last item went behind a running call instead of to the actor that freed first"


def test_map_runs_functions_on_the_pool_in_order(cluster, tiny):
    from raytune_primus.pool import ScoringPool
    from searchers.testing import SyntheticEvaluator

    with ScoringPool(SyntheticEvaluator(), tiny.space.baseline, num_actors=2) as pool:
        assert pool.map(_square, range(10)) == [x * x for x in range(10)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 700), st.integers(0, 3))
def test_tail_chunks_cut_the_last_batches_in_quarters(n, size, tail):
    from raytune_primus.pool import tail_chunks
    items = list(range(n))
    parts = tail_chunks(items, size, tail)
    assert [i for p in parts for i in p] == items and all(0 < len(p) <= size for p in parts)
    full = max(0, -(-n // size) - tail)
    assert all(len(p) == size for p in parts[:max(0, full - 1)]), "whole batches first (the last may be short)"
    assert all(len(p) <= max(1, size // 4) for p in parts[full:]), "the last batches' worth in quarters"


def test_shards_keep_candidates_of_one_layer_shape_on_one_actor():
    from raytune_primus.pool import PLAN_AXES, affinity_key, shards

    cands = [{"tp": tp, "mbs": mbs, "pp": pp, "pp_schedule": s} for tp in (1, 2, 4) for mbs in (1, 2)
             for pp in (1, 2, 4) for s in ("1f1b", "ilp")]
    parts = shards(cands, 2)
    assert sorted(i for p in parts for i in p) == list(range(len(cands)))
    owner = {affinity_key(cands[i]): a for a, p in enumerate(parts) for i in p}
    assert len(owner) == 6 and all(owner[affinity_key(cands[i])] == a for a, p in enumerate(parts) for i in p)
    assert sorted(len(p) for p in parts) == [18, 18]
    assert {"pp", "pp_schedule"} <= PLAN_AXES and shards(cands, 2) == parts


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["tp", "mbs", "pp", "pp_schedule", "ep"]),
                                st.one_of(st.integers(1, 3), st.sampled_from(["1f1b", "ilp"]),
                                          st.lists(st.integers(1, 2), max_size=1)), min_size=0, max_size=5),
                max_size=30))
def test_affinity_groups_partition_candidates_as_affinity_key_does(cands):
    # the itemgetter fast path over the first candidate's keys must group exactly as affinity_key: other key sets,
    # a key set differing only in plan axes, unhashable values, one or no non-plan key
    from raytune_primus.pool import _affinity_groups, affinity_key
    expected: dict = {}
    for i, c in enumerate(cands):
        expected.setdefault(affinity_key(c), []).append(i)
    assert _affinity_groups(cands) == expected


def test_an_item_held_against_once_goes_only_to_an_idle_actor():
    """_take: with calls already queued on the actor (suspects=False) an item that was on an actor when it died is
    passed over, also when stealing, and taken once the actor is idle: a death while it runs is then its own."""
    import collections

    from raytune_primus.pool import ScoringPool
    queue = collections.deque([(0, ["a"], 1, 0), (1, ["b"], 0, 0), (2, ["c"], 1, 1), (3, ["d"], 0, 1)])
    assert ScoringPool._take(queue, 0, steal=False, suspects=False)[1] == ["b"]
    assert ScoringPool._take(queue, 0, steal=True, suspects=False)[1] == ["d"]  # stolen: the non-suspect one
    assert ScoringPool._take(queue, 0, steal=True, suspects=False) is None  # only suspects left
    assert ScoringPool._take(queue, 0, steal=False, suspects=True)[1] == ["a"]
    assert ScoringPool._take(queue, 0, steal=True, suspects=True)[1] == ["c"] and not queue
