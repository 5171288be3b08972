"""The pipeline result's activation peaks read each rank's frontier of memory samples (``simulator._live``):
the same numbers, bit for bit, as reading every sample, for any schedule and non-negative activation sizes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.pipeline import _plan
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline.simulator import _live, _live_all, run_compiled
from tests.oracle.test_pipeline_properties import case_st

FIXED = tuple(n for n, s in SCHEDULES.items() if not s.cost_aware)


def _peaks(parts, act) -> list[float]:
    live, ranks, segments = parts
    return np.maximum.reduceat((live * np.asarray(act, dtype=float)[ranks]).sum(axis=1), segments).tolist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=case_st(FIXED), frac=st.floats(0.0, 1.0),
       scale=st.sampled_from([1.0, 1e-3, 3.7e9]), data=st.data())
def test_the_frontier_gives_every_samples_peaks(case, frac, scale, data):
    name, pp, vpp, m, costs = case
    plan = _plan(name, pp, vpp, m, None)[0]
    act = [[data.draw(st.floats(0.0, 10.0)) * scale for _ in range(vpp)] for _ in range(pp)]
    full, front = _live_all(plan, frac), _live(plan, frac)
    assert len(front[0]) <= len(full[0])
    assert _peaks(front, act) == _peaks(full, act)
    res = run_compiled(plan, costs)  # the result object reads the frontier
    assert list(res.peak_activation_bytes) == _peaks(_live_all(plan, costs.b_release_fraction), costs.act_bytes)


def test_a_long_run_keeps_a_few_samples_per_rank():
    plan = _plan("1f1b", 8, 1, 1024, None)[0]
    full, front = _live_all(plan, 0.5), _live(plan, 0.5)
    assert len(full[0]) >= 8 * 1024 and len(front[0]) == 8  # vpp 1: one sample per rank, its largest


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 7.25]), min_size=3, max_size=3),
                     min_size=1, max_size=60),
       pairwise=st.booleans(), weights=st.lists(st.floats(0.0, 1e9), min_size=3, max_size=3))
def test_non_dominated_keeps_every_undominated_row_once(rows, pairwise, weights):
    """Both ways (every pair at once, or one kept row at a time past ``_PAIRWISE_ROWS`` distinct rows) keep
    each row no other row is >= in every column, once, and drop only dominated rows (the pairwise way exactly
    the frontier): the largest weighted sum of the rows kept is that of all the rows, bit for bit."""
    import oracle.pipeline.simulator as sim
    arr = np.asarray(rows, dtype=float)
    saved = sim._PAIRWISE_ROWS
    sim._PAIRWISE_ROWS = len(arr) if pairwise else 0
    try:
        kept = sim._non_dominated(arr)
    finally:
        sim._PAIRWISE_ROWS = saved
    distinct = {tuple(r) for r in arr.tolist()}
    frontier = {r for r in distinct if not any(o != r and all(a >= b for a, b in zip(o, r)) for o in distinct)}
    got = [tuple(r) for r in kept.tolist()]
    assert len(got) == len(set(got)) and frontier <= set(got) <= distinct
    if pairwise:
        assert set(got) == frontier
    w = np.asarray(weights)
    assert (kept * w).sum(axis=1).max() == (arr * w).sum(axis=1).max()


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, float("nan")]), min_size=3, max_size=3),
                     min_size=1, max_size=40),
       cuts=st.lists(st.integers(1, 39), max_size=3), width=st.integers(1, 3))
def test_the_c_frontier_keeps_each_segments_exact_frontier_once(rows, cuts, width):
    """The C extension's ``frontier`` (what ``_live`` runs where it is built) keeps, per segment, each row no other
    row of the segment is >= in every column (NaN never is), the first of equal rows, in row order; the pairwise
    numpy way keeps the same set."""
    import oracle.pipeline.simulator as sim
    from oracle.pipeline import _jit
    ext = _jit.extension()
    if ext is None:
        pytest.skip("the C extension is not built here")
    arr = np.asarray([r[:width] for r in rows], dtype=float)
    segs = np.asarray(sorted({0} | {c for c in cuts if c < len(arr)}), dtype=np.int64)
    keep = np.zeros(len(arr), dtype=np.uint8)
    count = ext.frontier(arr, width, segs, keep)
    assert count == int(keep.sum())
    bounds = segs.tolist() + [len(arr)]
    saved = sim._PAIRWISE_ROWS
    sim._PAIRWISE_ROWS = len(arr)
    try:
        for a, b in zip(bounds[:-1], bounds[1:]):
            seg = arr[a:b]
            ge = lambda y, x: all(p >= q for p, q in zip(y, x))  # noqa: E731 - numpy's >= (False with NaN)
            want = [i for i in range(len(seg)) if not any(ge(seg[j], seg[i]) and (j < i or not ge(seg[i], seg[j]))
                                                          for j in range(len(seg)) if j != i)]
            assert np.flatnonzero(keep[a:b]).tolist() == want
            if not np.isnan(seg).any():  # numpy's pairwise way keeps the same rows (one of equal ones, sorted)
                assert sorted(map(tuple, sim._non_dominated(seg).tolist())) == sorted(map(tuple, seg[want].tolist()))
    finally:
        sim._PAIRWISE_ROWS = saved
