"""The batch path agrees exactly with the scalar path: ``project_many`` against ``project`` one run at a time,
and the numpy batched pipeline replay (``run_compiled_many``) against the scalar chain (hypothesis)."""
from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.pipeline import _plan, run_compiled, run_schedule_many
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline.simulator import BATCH_REPLAY_MIN, BATCH_REPLAY_WORK, run_compiled_many
from oracle.projector import project, project_many
from searchers.space import SearchSpace
from tests.oracle.test_pipeline_jit import jit
from tests.oracle.test_pipeline_properties import costs_st

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXED = tuple(n for n, s in SCHEDULES.items() if not s.cost_aware)
VPP = {"one": 1, "two": 2}


@st.composite
def batch_st(draw):
    name = draw(st.sampled_from(FIXED))
    spec = SCHEDULES[name]
    pp = draw(st.integers(2, 5))
    vpp = VPP.get(spec.vpp_rule) or draw(st.integers(2, 3))
    least = spec.min_microbatches(pp, vpp) if spec.min_microbatches else 1
    m = draw(st.integers(least, least + 2 * pp))
    least_n = max(BATCH_REPLAY_MIN, -(-BATCH_REPLAY_WORK // pp))  # a batch the numpy replay takes
    n = draw(st.integers(least_n, least_n + 6))
    return name, pp, vpp, m, [draw(costs_st(pp, vpp)) for _ in range(n)]


@SETTINGS
@given(batch_st())
def test_batched_replay_is_the_scalar_replay(case):
    name, pp, vpp, m, costs = case
    plan, approximate, note = _plan(name, pp, vpp, m, None)
    with jit("off"):  # the numpy levels (a process that has switched to the compiled replay skips them)
        many = run_compiled_many(plan, costs, name=name, approximate=approximate, note=note)
    assert many == [run_compiled(plan, c, name=name, approximate=approximate, note=note, timeline=False)
                    for c in costs]
    assert run_schedule_many(name, pp, vpp, m, costs) == many


def test_run_schedule_many_refuses_cost_aware_schedules():
    with pytest.raises(InvalidConfigError, match="run_schedule"):
        run_schedule_many("ilp", 2, 1, 4, [])


@lru_cache(maxsize=1)
def _space() -> SearchSpace:
    """Mixtral 8x22B on 32 MI355X with pp 2/4 and the micro-batch fixed: few pipeline plans, so random
    samples hold batches of one plan (replayed together) next to plans met once (replayed alone)."""
    base = RunConfig.from_dict({"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 4, "vpp": 2, "ep": 8, "tp": 2}})
    return SearchSpace(base, restrict={"pp": [2, 4], "tp": [2, 4], "cp": [1], "mbs": [1], "precision": ["bf16", "fp8"],
                                       "pp_schedule": ["1f1b", "interleaved", "zero_bubble", "zbv"]})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.booleans())
def test_project_many_is_project_one_by_one(rnd, memory_tree):
    space = _space()
    runs = [space.run_of(p) for p in rnd.sample(space.points, 40)]
    plans = {}
    for r in runs:
        plans.setdefault((r.training.schedule, r.training.pp, r.training.vpp), []).append(r)
    assume(max(len(v) for v in plans.values()) >= BATCH_REPLAY_MIN)  # a batch is replayed together
    batch = project_many(runs, fast_schedules=True, memory_tree=memory_tree)
    assert [p.to_dict() for p in batch] == [project(r, fast_schedules=True, memory_tree=memory_tree).to_dict()
                                            for r in runs]


def test_project_many_returns_errors_in_place():
    space = _space()
    good = space.run_of(space.points[0])
    bad = good.with_training(pp=3)  # 3 does not divide 32 GPUs: the layout cannot be built
    out = project_many([good, bad, good], errors="return")
    assert out[0].to_dict() == out[2].to_dict() == project(good).to_dict()
    assert isinstance(out[1], Exception)
    with pytest.raises(Exception):
        project_many([good, bad])
    with pytest.raises(InvalidConfigError, match="errors="):
        project_many([good], errors="ignore")
