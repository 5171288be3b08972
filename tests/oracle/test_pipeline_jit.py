"""The compiled pipeline replay (``oracle.pipeline._jit``) gives the Python replay's makespans bit for bit,
switches on only after enough replay work, and never makes numba a requirement."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replay_st())
def test_compiled_replay_is_the_python_replay_bit_for_bit(case):
    pytest.importorskip("numba")
    name, pp, vpp, m, costs = case
    plan, _, _ = _plan(name, pp, vpp, m, None)
    with jit("off"):
        python = [run_compiled(plan, c, timeline=False) for c in costs]
        batch = run_compiled_many(plan, costs)
    with jit("on"):
        compiled = [run_compiled(plan, c, timeline=False) for c in costs]
        assert _jit.compiled(0) is not None, "on: compiled from the first replay"
        assert run_compiled_many(plan, costs) == compiled
    assert compiled == python == batch
    assert [r.makespan_s for r in compiled] == [r.makespan_s for r in python]  # floats compared exactly


def test_projections_are_the_same_with_the_compiled_replay():
    pytest.importorskip("numba")
    base = RunConfig.from_dict({"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 4, "vpp": 2, "ep": 8, "tp": 2}})
    space = SearchSpace(base, restrict={"pp": [2, 4, 8], "tp": [1, 2], "cp": [1], "mbs": [1, 2]})
    runs = [space.run_of(p) for p in space.points[::max(1, len(space.points) // 60)]]
    with jit("off"):
        python = [project(r, fast_schedules=True, memory_tree=False).to_dict() for r in runs]
    with jit("on"):
        compiled = [project(r, fast_schedules=True, memory_tree=False).to_dict() for r in runs]
    assert compiled == python


def test_auto_switches_only_after_enough_replay_work():
    pytest.importorskip("numba")
    plan, _, _ = _plan("1f1b", 4, 1, 8, None)
    costs = _costs(4, 1)
    with jit("auto"):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is None and _jit._state["steps"] == len(plan.chain)
    with jit("auto", steps=_jit.JIT_AFTER_STEPS):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is not None
    with jit("off", steps=_jit.JIT_AFTER_STEPS):
        run_compiled(plan, costs, timeline=False)
        assert _jit._state["fn"] is None


def test_without_numba_the_python_replay_stays(monkeypatch):
    plan, _, _ = _plan("interleaved", 2, 2, 4, None)
    costs = _costs(2, 2)
    with jit("off"):
        want = run_compiled(plan, costs, timeline=False)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    with jit("on"):
        assert run_compiled(plan, costs, timeline=False) == want
        assert _jit._state["tried"] and _jit._state["fn"] is None


def test_a_bad_mode_is_named():
    with jit("fast"), pytest.raises(InvalidConfigError, match="RAYTUNE_PRIMUS_JIT='fast' is not one of auto, on, off"):
        _jit.compiled(10)


def test_load_now_loads_unless_off():
    pytest.importorskip("numba")
    with jit("off"):
        assert _jit.load_now() is False and _jit._state["fn"] is None
    with jit("auto"):  # a bulk process (a Ray scorer at start-up) loads it before any replay counted
        assert _jit.load_now() is True and _jit.compiled(1) is not None
        assert _jit.load_now() is True  # once
    with jit("fast"), pytest.raises(InvalidConfigError, match="RAYTUNE_PRIMUS_JIT='fast'"):
        _jit.load_now()

