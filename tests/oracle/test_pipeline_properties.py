"""Hypothesis properties of the pipeline simulator and schedules (random heterogeneous costs)."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.pipeline import (Op, StageCosts, build_order, closed_form_bubble, lower_bound_s, run_schedule,
                             simulate, stage_map, virtual_stage)
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline.schedules.ilp import solve_w_placement
from oracle.pipeline.schedules.one_f_one_b import fb_sequence
from tests.oracle.test_pipeline import VPP_OF, assert_every_op_once

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
cost = st.floats(min_value=0.05, max_value=3.0, allow_nan=False)


@st.composite
def costs_st(draw, pp: int, vpp: int, p2p_max: float = 0.5) -> StageCosts:
    def mat():
        return [[draw(cost) for _ in range(vpp)] for _ in range(pp)]
    per_boundary = draw(st.booleans())
    n_b = pp * vpp - 1
    p2p = (tuple(draw(st.floats(0.0, p2p_max)) for _ in range(n_b)) if per_boundary
           else draw(st.floats(0.0, p2p_max)))
    return StageCosts(f_s=mat(), b_s=mat(), w_s=mat(), act_bytes=mat(), p2p_s=p2p,
                      b_release_fraction=draw(st.floats(0.0, 1.0)))


@st.composite
def case_st(draw, names=tuple(SCHEDULES)):
    name = draw(st.sampled_from(names))
    pp = draw(st.integers(1, 6))
    vpp = VPP_OF[name] if SCHEDULES[name].vpp_rule != "at_least_two" else draw(st.integers(2, 3))
    least = SCHEDULES[name].min_microbatches(pp, vpp) if SCHEDULES[name].min_microbatches else 1
    m = draw(st.integers(least, max(least, 3 * pp)))
    return name, pp, vpp, m, draw(costs_st(pp, vpp))


def reference_times(order, pp, vpp, layout, m, costs):
    """Naive fixpoint of the semantics (independent of the simulator's tables): start = max(previous
    op on the rank, every dependency's end + p2p), iterated until nothing moves. With blocking sends
    an F (B) lasts its cost plus the send to the next (previous) stage when that is another rank, and
    the dependency edges carry no latency."""
    smap = stage_map(layout, pp, vpp)
    lat = costs.boundary_p2p_s()
    blocking = costs.p2p_blocking
    send = costs.boundary_p2p_s()
    n = pp * vpp

    def held(kind, v, r):
        if not blocking:
            return 0.0
        if kind == "F" and v + 1 < n and smap[v + 1][0] != r:
            return send[v]
        if kind in ("B", "BW") and v > 0 and smap[v - 1][0] != r:
            return send[v - 1]
        return 0.0
    if blocking:
        lat = (0.0,) * len(lat)
    dur = {"F": costs.f_s, "B": costs.b_s, "W": costs.w_s}
    end: dict[tuple[str, int, int], float] = {}
    start = {}
    for _ in range(sum(len(o) for o in order) + 2):
        changed = False
        for r, ops in enumerate(order):
            t = 0.0
            for op in ops:
                v = virtual_stage(layout, pp, vpp, r, op.chunk)
                deps = []
                if op.kind == "F" and v > 0:
                    deps.append((("F", op.mb, v - 1), 0.0 if smap[v - 1][0] == r else lat[v - 1]))
                if op.kind in ("B", "BW"):
                    deps.append((("F", op.mb, v), 0.0))
                    if v < pp * vpp - 1:
                        deps.append((("B", op.mb, v + 1), 0.0 if smap[v + 1][0] == r else lat[v]))
                if op.kind == "W":
                    deps.append((("B", op.mb, v), 0.0))
                s = max([t] + [end.get(k, float("inf")) + d for k, d in deps])
                if s == float("inf"):
                    break
                d = (costs.b_s[r][op.chunk] + costs.w_s[r][op.chunk]) if op.kind == "BW" else dur[op.kind][r][op.chunk]
                d += held(op.kind, v, r)
                key = ("B" if op.kind == "BW" else op.kind, op.mb, v)
                if start.get((r, op)) != s:
                    changed = True
                start[(r, op)] = s
                end[key] = s + d
                t = s + d
        if not changed:
            break
    return start


@SETTINGS
@given(case_st())
def test_simulator_matches_reference_semantics(case):
    name, pp, vpp, m, costs = case
    res = run_schedule(name, pp, vpp, m, costs)
    ref = reference_times([list(o) for o in res.order], pp, vpp, SCHEDULES[name].layout, m, costs)
    for r, ops in enumerate(res.order):
        for op, s in zip(ops, res.start_s[r]):
            assert s == pytest.approx(ref[(r, op)], rel=1e-9, abs=1e-9)
    assert_every_op_once(res)


@SETTINGS
@given(case_st(), st.booleans())
def test_folded_replay_is_bit_identical(case, blocking):
    """The search path (timeline=False: same-rank inputs dropped, ops nobody waits for folded into the
    rank's next op) gives exactly the makespan, busy times and memory peaks of the full replay, and
    the makespan is the last op's end of the timeline."""
    name, pp, vpp, m, costs = case
    costs = dataclasses.replace(costs, p2p_blocking=blocking)
    full = run_schedule(name, pp, vpp, m, costs)
    fast = run_schedule(name, pp, vpp, m, costs, timeline=False)
    assert fast.makespan_s == full.makespan_s
    assert fast.busy_s == full.busy_s and fast.peak_activation_bytes == full.peak_activation_bytes
    assert full.makespan_s == max(ends[-1] for ends in full.end_s if ends)


@SETTINGS
@given(case_st())
def test_never_beats_the_critical_path(case):
    name, pp, vpp, m, costs = case
    res = run_schedule(name, pp, vpp, m, costs)
    assert res.makespan_s >= lower_bound_s(pp, vpp, SCHEDULES[name].layout, m, costs) * (1 - 1e-12) - 1e-12
    assert res.makespan_s >= max(res.busy_s) - 1e-9
    for r in range(pp):
        expect = m * sum(costs.f_s[r][c] + costs.b_s[r][c] + costs.w_s[r][c] for c in range(vpp))
        assert res.busy_s[r] == pytest.approx(expect)


@SETTINGS
@given(case_st(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_p2p_increases_makespan_monotonically(case, a, b):
    """For a fixed order the makespan is a max-plus function of the costs: monotone in every p2p."""
    name, pp, vpp, m, costs = case
    order = build_order(name, pp, vpp, m, costs)
    layout = SCHEDULES[name].layout
    lo, hi = sorted((a, b))

    def with_p2p(x):
        return StageCosts(f_s=costs.f_s, b_s=costs.b_s, w_s=costs.w_s, act_bytes=costs.act_bytes, p2p_s=x,
                          b_release_fraction=costs.b_release_fraction)
    spans = [simulate(order, pp, vpp, layout, m, with_p2p(x)).makespan_s for x in (0.0, lo, hi)]
    assert spans[0] <= spans[1] + 1e-9 <= spans[2] + 2e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.floats(0.1, 5.0), st.floats(0.1, 5.0), st.integers(1, 40))
def test_uniform_stages_equal_closed_form(pp, vpp, f, b, m):
    """1F1B for any m and f:b; interleaved for m >= pp (Megatron's rule), per-chunk cost 1/vpp."""
    res = run_schedule("1f1b", pp, 1, m, StageCosts.uniform(pp=pp, f_s=f, b_s=b))
    assert res.bubble_ratio == pytest.approx(closed_form_bubble("1f1b", pp, 1, m), rel=1e-9, abs=1e-12)
    if vpp >= 2 and m >= pp:
        res = run_schedule("interleaved", pp, vpp, m, StageCosts.uniform(pp=pp, vpp=vpp, f_s=f / vpp, b_s=b / vpp))
        assert res.bubble_ratio == pytest.approx(closed_form_bubble("interleaved", pp, vpp, m), rel=1e-9, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6).flatmap(lambda pp: st.tuples(st.just(pp), st.integers(pp, 2 * pp), costs_st(pp, 1))))
def test_ilp_never_worse_than_zero_bubble(case):
    pp, m, costs = case
    ilp = run_schedule("ilp", pp, 1, m, costs)
    zb = run_schedule("zero_bubble", pp, 1, m, costs)
    assert ilp.makespan_s <= zb.makespan_s * (1 + 1e-9) + 1e-9
    assert ilp.max_peak_activation_bytes <= zb.max_peak_activation_bytes * (1 + 1e-9) + 1e-9


def all_w_placements(fb: list[Op], m: int):
    """Every way to merge W(0..m-1), FIFO, into one rank's F/B list with W(j) after B(j)."""
    def rec(i, next_w, b_done, out):
        if i == len(fb) and next_w == m:
            yield list(out)
            return
        if next_w < b_done:  # a W may go here
            out.append(Op("W", next_w, 0))
            yield from rec(i, next_w + 1, b_done, out)
            out.pop()
        if i < len(fb):
            out.append(fb[i])
            yield from rec(i + 1, next_w, b_done + (fb[i].kind == "B"), out)
            out.pop()
    yield from rec(0, 0, 0, [])


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]).flatmap(
    lambda s: st.tuples(st.just(s[0]), st.just(s[1]), costs_st(s[0], 1))))
def test_ilp_equals_brute_force_on_tiny_instances(case):
    """Enumerate every W placement on the ZB-H1 F/B skeleton: the MILP optimum is the true optimum,
    both unconstrained and under the default memory cap (zero_bubble's peak)."""
    pp, m, costs = case
    per_rank = [list(all_w_placements(fb_sequence(pp, r, m, backward="B"), m)) for r in range(pp)]
    sims = [simulate(list(order), pp, 1, "interleaved", m, costs) for order in itertools.product(*per_rank)]
    free = solve_w_placement(pp, m, costs, mem_cap_bytes=float("inf"))
    assert free.optimal
    assert free.makespan_s == pytest.approx(min(r.makespan_s for r in sims), rel=1e-7, abs=1e-9)
    cap = run_schedule("zero_bubble", pp, 1, m, costs).max_peak_activation_bytes
    capped = solve_w_placement(pp, m, costs)
    assert capped.optimal
    feasible = [r.makespan_s for r in sims if r.max_peak_activation_bytes <= cap * (1 + 1e-9) + 1e-12]
    assert capped.makespan_s == pytest.approx(min(feasible), rel=1e-7, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6).flatmap(lambda pp: st.tuples(st.just(pp), st.integers(1, 4 * pp), costs_st(pp, 2, 0.2))))
def test_v_schedules_respect_their_memory_caps(case):
    pp, m, costs = case
    one_stage = [costs.act_bytes[r][0] + costs.act_bytes[r][1] for r in range(pp)]
    for name, frac in (("zbv_greedy", 1.0), ("v_half", 0.5)):
        res = run_schedule(name, pp, 2, m, costs)
        for r in range(pp):
            cap = max(frac * pp * one_stage[r], one_stage[r])
            assert res.peak_activation_bytes[r] <= cap * (1 + 1e-9)


@SETTINGS
@given(case_st())
def test_blocking_sends_match_reference_and_never_help(case):
    """Blocking sends (Megatron 1F1B semantics) on any schedule: the simulator equals the naive
    fixpoint, and holding the sender never shortens the makespan of the same order."""
    name, pp, vpp, m, costs = case
    order = build_order(name, pp, vpp, m, costs)
    layout = SCHEDULES[name].layout
    block = dataclasses.replace(costs, p2p_blocking=True)
    res = simulate(order, pp, vpp, layout, m, block)
    ref = reference_times([list(o) for o in res.order], pp, vpp, layout, m, block)
    for r, ops in enumerate(res.order):
        for op, s in zip(ops, res.start_s[r]):
            assert s == pytest.approx(ref[(r, op)], rel=1e-9, abs=1e-9)
    assert res.makespan_s >= simulate(order, pp, vpp, layout, m, costs).makespan_s - 1e-9
    assert res.busy_s == simulate(order, pp, vpp, layout, m, costs).busy_s
