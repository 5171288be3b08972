"""The compiled pipeline replay (``oracle.pipeline._jit``: the C extension ``_native`` or numba) gives the Python
replay's makespans bit for bit, loads numba only after enough replay work, and makes neither a requirement."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oracle.pipeline
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.pipeline import StageCosts, _jit, _plan, run_compiled
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline.simulator import run_compiled_many
from oracle.projector import project
from searchers.space import SearchSpace
from tests.oracle.test_pipeline_properties import costs_st

FIXED = tuple(n for n, s in SCHEDULES.items() if not s.cost_aware)


def _costs(pp: int, vpp: int) -> StageCosts:
    def mat(x: float) -> list[list[float]]:
        return [[x * (1 + 0.1 * r + 0.01 * c) for c in range(vpp)] for r in range(pp)]
    return StageCosts(f_s=mat(1.0), b_s=mat(2.0), w_s=mat(0.5), act_bytes=mat(1.0), p2p_s=0.05)


@contextlib.contextmanager
def jit(mode: str, steps: int = 0) -> Iterator[None]:
    """Run with ``RAYTUNE_PRIMUS_JIT=mode`` from a fresh switch (``steps`` already counted)."""
    import os
    old = os.environ.get("RAYTUNE_PRIMUS_JIT")
    os.environ["RAYTUNE_PRIMUS_JIT"] = mode
    _jit.reset(steps)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAYTUNE_PRIMUS_JIT", None)
        else:
            os.environ["RAYTUNE_PRIMUS_JIT"] = old
        _jit.reset()


@st.composite
def replay_st(draw):
    name = draw(st.sampled_from(FIXED))
    spec = SCHEDULES[name]
    pp = draw(st.integers(1, 6))
    vpp = {"one": 1, "two": 2}.get(spec.vpp_rule) or draw(st.integers(2, 3))
    least = spec.min_microbatches(pp, vpp) if spec.min_microbatches else 1
    m = draw(st.integers(least, least + 3 * pp))
    costs = [dataclasses.replace(draw(costs_st(pp, vpp)), p2p_blocking=draw(st.booleans()))
             for _ in range(draw(st.integers(1, 10)))]
    return name, pp, vpp, m, costs


BACKENDS = ("native", "numba")


def use(backend: str) -> str:
    """The ``RAYTUNE_PRIMUS_JIT`` mode that runs ``backend``, skipping where it is not available here."""
    if backend == "native":
        if _jit.native() is None:
            pytest.skip("the C extension oracle.pipeline._native was not built here (no C compiler at install)")
        return "on"
    pytest.importorskip("numba")
    return "numba"


@pytest.fixture
def no_native(monkeypatch):
    """As where the C extension was not built."""
    monkeypatch.setattr(_jit, "_NATIVE", {"ext": None})


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=replay_st())
def test_compiled_replay_is_the_python_replay_bit_for_bit(backend, case):
    mode = use(backend)
    name, pp, vpp, m, costs = case
    plan, _, _ = _plan(name, pp, vpp, m, None)
    with jit("off"):
        python = [run_compiled(plan, c, timeline=False) for c in costs]
        batch = run_compiled_many(plan, costs)
    with jit(mode):
        compiled = [run_compiled(plan, c, timeline=False) for c in costs]
        assert _jit.compiled(0) is not None and _jit.backend() == backend, "compiled from the first replay"
        assert run_compiled_many(plan, costs) == compiled
    assert compiled == python == batch
    assert [r.makespan_s for r in compiled] == [r.makespan_s for r in python]  # floats compared exactly


@pytest.mark.parametrize("backend", BACKENDS)
def test_projections_are_the_same_with_the_compiled_replay(backend):
    mode = use(backend)
    base = RunConfig.from_dict({"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 4, "vpp": 2, "ep": 8, "tp": 2}})
    space = SearchSpace(base, restrict={"pp": [2, 4, 8], "tp": [1, 2], "cp": [1], "mbs": [1, 2]})
    runs = [space.run_of(p) for p in space.points[::max(1, len(space.points) // 60)]]
    with jit("off"):
        python = [project(r, fast_schedules=True, memory_tree=False).to_dict() for r in runs]
    with jit(mode):
        compiled = [project(r, fast_schedules=True, memory_tree=False).to_dict() for r in runs]
        assert _jit.backend() == backend
    assert compiled == python


def test_auto_runs_the_c_extension_from_the_first_replay():
    use("native")
    plan, _, _ = _plan("1f1b", 4, 1, 8, None)
    with jit("auto"):
        run_compiled(plan, _costs(4, 1), timeline=False)
        assert _jit.backend() == "native" and _jit._state["steps"] == 0  # nothing to pay off: no counting


def test_auto_switches_to_numba_only_after_enough_replay_work(no_native):
    pytest.importorskip("numba")
    plan, _, _ = _plan("1f1b", 4, 1, 8, None)
    costs = _costs(4, 1)
    with jit("auto"):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is None and _jit._state["steps"] == len(plan.chain)
        assert _jit.backend() == "python"
    with jit("auto", steps=_jit.JIT_AFTER_STEPS):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is not None and _jit.backend() == "numba"
    with jit("off", steps=_jit.JIT_AFTER_STEPS):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is None and _jit.backend() == "python"


def test_without_numba_or_the_extension_the_python_replay_stays(monkeypatch, no_native):
    plan, _, _ = _plan("interleaved", 2, 2, 4, None)
    costs = _costs(2, 2)
    with jit("off"):
        want = run_compiled(plan, costs, timeline=False)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    for mode in ("on", "numba", "auto"):
        with jit(mode, steps=_jit.JIT_AFTER_STEPS):
            assert run_compiled(plan, costs, timeline=False) == want
            assert _jit._state["tried"] and _jit._state["fn"] is None and _jit.backend() == "python"


def test_a_build_of_another_source_is_not_used(monkeypatch):
    """setup.py records the SHA-256 of the _native.c it compiled; a build from another source is never run."""
    if _jit.native() is not None:
        assert _jit.extension().SOURCE_SHA256 == _jit.source_sha256()
    stale = types.SimpleNamespace(SOURCE_SHA256="0" * 64, chain_prepare=None, prepared_span=None)
    monkeypatch.setitem(sys.modules, "oracle.pipeline._native", stale)
    monkeypatch.setattr(oracle.pipeline, "_native", stale, raising=False)
    monkeypatch.setattr(_jit, "_NATIVE", {})  # not probed yet in this process (restored after the test)
    assert _jit.native() is None


def test_the_c_extension_refuses_bad_input_with_an_error():
    use("native")
    ext = _jit.extension()
    chain = np.array([[0, -1, -1, -1, -1, 0], [1, 0, -1, -1, -1, 1]], dtype=np.int64)
    tails = np.array([[1, -1]], dtype=np.int64)
    cost, lat = [1.5, 2.0, 0.0], [0.0]
    prepared = ext.chain_prepare(chain, tails, 2)
    assert ext.prepared_span(prepared, cost, lat) == 3.5  # -1: the sentinel key, the trailing 0.0 cost / latency
    with jit("off"):  # the same chain in the Python loop (via a plan-less replay of the same recurrence)
        fin = [0.0] * 3
        for key, prev, fold, d, b, ci in chain.tolist():
            fin[key] = max(fin[prev] + cost[fold], fin[d] + lat[b]) + cost[ci]
        assert max(fin[k] + cost[f] for k, f in tails.tolist()) == 3.5
    # indices outside the compiler's form (a key past n_keys, an index below -1): no handle, the Python loop
    assert ext.chain_prepare(chain, tails, 1) is None
    assert ext.chain_prepare(np.array([[0, -2, -1, -1, -1, 0]], dtype=np.int64), tails[:, :] * 0, 2) is None
    assert ext.chain_prepare(chain, np.zeros((0, 2), dtype=np.int64), 2) is None  # no tails: no makespan
    with pytest.raises(IndexError, match="indexes 2 costs and 1 latencies, got 1 and 1"):
        ext.prepared_span(prepared, [1.0], lat)
    with pytest.raises(IndexError, match="got 3 and 0"):
        ext.prepared_span(prepared, cost, [])
    with pytest.raises(TypeError, match="chain_prepare: chain must be a C-contiguous int64 array of rows of 6"):
        ext.chain_prepare(chain.astype(np.int32), tails, 2)
    with pytest.raises(TypeError, match="chain_prepare: chain must be"):
        ext.chain_prepare(np.asfortranarray(np.zeros((2, 6), dtype=np.int64)), tails, 2)
    with pytest.raises(TypeError, match="chain_prepare: tails must be a C-contiguous int64 array of rows of 2"):
        ext.chain_prepare(chain, np.zeros(3, dtype=np.int64), 2)
    with pytest.raises(TypeError, match="cost must be a list of floats"):
        ext.prepared_span(prepared, tuple(cost), lat)
    with pytest.raises(TypeError):
        ext.prepared_span(prepared, ["x", 2.0, 0.0], lat)
    with pytest.raises(TypeError, match="must come from chain_prepare"):
        ext.prepared_span(chain, cost, lat)
    with pytest.raises(ValueError, match="n_keys must be >= 0"):
        ext.chain_prepare(chain, tails, -1)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        ext.prepared_span(prepared, cost)
    chain[0, 0] = 99  # the handle holds its own copy: changing the array afterwards cannot reach it
    assert ext.prepared_span(prepared, cost, lat) == 3.5


def test_a_bad_mode_is_named():
    with jit("fast"), pytest.raises(InvalidConfigError,
                                    match="RAYTUNE_PRIMUS_JIT='fast' is not one of auto, on, numba, off"):
        _jit.compiled(10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_now_loads_unless_off(backend):
    mode = use(backend)
    with jit("off"):
        assert _jit.load_now() is False and _jit._state["fn"] is None
    with jit("auto" if backend == "native" else mode):  # a bulk process (a Ray scorer at start-up) loads it first
        assert _jit.load_now() is True and _jit.compiled(1) is not None and _jit.backend() == backend
        assert _jit.load_now() is True  # once
    with jit("fast"), pytest.raises(InvalidConfigError, match="RAYTUNE_PRIMUS_JIT='fast'"):
        _jit.load_now()


def test_load_now_without_the_extension_loads_numba(no_native):
    pytest.importorskip("numba")
    with jit("auto"):
        assert _jit.load_now() is True and _jit.backend() == "numba"


def test_a_chain_the_compiled_replay_does_not_take_replays_in_python(monkeypatch):
    """``prepare`` answers None (the C extension, for indices outside the compiler's form): the Python loop."""
    plan, _, _ = _plan("interleaved", 2, 2, 4, None)
    costs = _costs(2, 2)
    with jit("off"):
        want = run_compiled(plan, costs, timeline=False)
        spans = []
        monkeypatch.setitem(_jit._state, "fn", _jit.Replay(lambda *a: None, lambda *a: spans.append(a) or 0.0))
        assert run_compiled(plan, costs, timeline=False) == want and spans == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plan_with_a_prepared_chain_pickles_and_replays_the_same(backend):
    """The prepared chain (a C capsule) stays behind: the copy prepares its own on first use."""
    import pickle
    mode = use(backend)
    plan, _, _ = _plan("zbv", 3, 2, 6, None)
    costs = _costs(3, 2)
    with jit(mode):
        want = run_compiled(plan, costs, timeline=False)
        assert plan.prepared is not None and plan.prepared.handle is not None
        copy = pickle.loads(pickle.dumps(plan))
        assert copy.prepared is not None and copy.prepared.replay is None
        assert run_compiled(copy, costs, timeline=False) == want
