"""Pipeline schedules + simulator: closed forms, memory, edge cases, the paper's Table 6 ordering."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter

import pytest

import oracle.pipeline as P
from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.pipeline import (Op, StageCosts, applicable_schedules, closed_form_bubble, compare_schedules,
                             lower_bound_s, run_schedule, simulate, virtual_stage)
from oracle.pipeline.schedules import SCHEDULES, register

ALL = tuple(SCHEDULES)
VPP_OF = {name: {"one": 1, "two": 2, "at_least_two": 2}[spec.vpp_rule] for name, spec in SCHEDULES.items()}


def uniform(pp: int, vpp: int, f: float = 1.0, b: float = 1.0, w: float = 1.0, p2p: float = 0.0,
            act: float = 1.0, frac: float = 0.5) -> StageCosts:
    """Uniform per-chunk costs for a model whose full stage costs (f, b, w): a chunk is 1/vpp of it."""
    return StageCosts.uniform(pp=pp, vpp=vpp, f_s=f / vpp, b_s=b / vpp, w_s=w / vpp, act_bytes=act / vpp,
                              p2p_s=p2p, b_release_fraction=frac)


def assert_every_op_once(res: P.PipelineResult) -> None:
    """Each (rank, chunk, mb) has one F and either one BW or one B and one W; nothing else."""
    count = Counter((r, e.op.kind, e.op.mb, e.op.chunk) for r, e in ((e.rank, e) for e in res.timeline))
    assert all(v == 1 for v in count.values()), [k for k, v in count.items() if v != 1]
    for r in range(res.pp):
        for c in range(res.vpp):
            for mb in range(res.num_microbatches):
                assert count[(r, "F", mb, c)] == 1
                fused = count[(r, "BW", mb, c)]
                split = (count[(r, "B", mb, c)], count[(r, "W", mb, c)])
                assert (fused, split) in ((1, (0, 0)), (0, (1, 1)))
    assert len(count) == sum(len(o) for o in res.order)


# ---------------------------------------------------------------- stage mapping
def test_virtual_stage_layouts():
    assert [virtual_stage("interleaved", 4, 2, r, c) for c in range(2) for r in range(4)] == list(range(8))
    assert virtual_stage("v", 4, 2, 0, 0) == 0 and virtual_stage("v", 4, 2, 0, 1) == 7  # loss on rank 0
    assert virtual_stage("v", 4, 2, 3, 0) == 3 and virtual_stage("v", 4, 2, 3, 1) == 4  # the turn
    with pytest.raises(ValueError, match="vpp=2"):
        virtual_stage("v", 4, 1, 0, 0)


def test_costs_from_virtual_stages_put_the_loss_on_rank0_for_v():
    f = [1.0] * 7 + [5.0]  # last virtual stage carries the output layer
    v = StageCosts.from_virtual_stages(layout="v", pp=4, vpp=2, f_s=f, b_s=f, w_s=f, act_bytes=f)
    il = StageCosts.from_virtual_stages(layout="interleaved", pp=4, vpp=2, f_s=f, b_s=f, w_s=f, act_bytes=f)
    assert v.f_s[0][1] == 5.0 and il.f_s[3][1] == 5.0


def test_stage_costs_validation_lists_every_problem():
    with pytest.raises(InvalidConfigError) as err:
        StageCosts(f_s=[[1.0, 2.0]], b_s=[[1.0]], w_s=[[-1.0, 0.0]], act_bytes=[[1.0, 1.0]], p2p_s=(0.1, 0.2),
                   b_release_fraction=1.5)
    msg = str(err.value)
    assert "b_s has row lengths" in msg and "w_s[0][0] = -1.0" in msg and "p2p_s has 2 values" in msg
    assert "b_release_fraction = 1.5" in msg


# ---------------------------------------------------------------- closed forms, uniform stages, zero p2p
@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 32])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (1.0, 1.0), (0.7, 1.9)])
def test_1f1b_makespan_is_exact(pp, m, f, b):
    res = run_schedule("1f1b", pp, 1, m, uniform(pp, 1, f=f, b=b, w=0.0))
    assert res.makespan_s == pytest.approx((m + pp - 1) * (f + b), rel=1e-12)
    assert res.bubble_ratio == pytest.approx(closed_form_bubble("1f1b", pp, 1, m), rel=1e-9, abs=1e-12)
    assert res.peak_in_flight == tuple(min(pp - r, m) for r in range(pp))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("vpp", [2, 3, 4])
@pytest.mark.parametrize("m_mult", [1, 2, 4])
def test_interleaved_matches_closed_form(pp, vpp, m_mult):
    m = pp * m_mult
    f, b = 1.0, 2.0
    res = run_schedule("interleaved", pp, vpp, m, uniform(pp, vpp, f=f, b=b, w=0.0))
    ideal = m * (f + b)
    assert res.makespan_s == pytest.approx(ideal * (1 + (pp - 1) / (vpp * m)), rel=1e-9)
    assert res.bubble_ratio == pytest.approx(closed_form_bubble("interleaved", pp, vpp, m), rel=1e-9)


@pytest.mark.parametrize("pp,m", [(4, 5), (4, 7), (8, 9), (8, 13), (3, 10)])
def test_interleaved_non_multiple_microbatches(pp, m):
    """m % pp != 0: Megatron's group-size rule; no deadlock and still the closed-form bubble."""
    res = run_schedule("interleaved", pp, 2, m, uniform(pp, 2, f=1.0, b=2.0, w=0.0))
    assert "group size" in res.note
    assert res.bubble_ratio == pytest.approx((pp - 1) / (2 * m), rel=1e-9)


def test_interleaved_rejects_fewer_microbatches_than_pp():
    with pytest.raises(InvalidConfigError, match="num_microbatches >= 4"):
        run_schedule("interleaved", 4, 2, 3, uniform(4, 2))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m_mult", [1, 2, 4])
def test_zero_bubble_is_one_third_of_1f1b(pp, m_mult):
    """F = B = W = T: ZB-H1 makespan is exactly 3mT + (p-1)T, its bubble (p-1)(T_F + T_B - T_W) is
    one third of 1F1B's (p-1)(T_F + T_B + T_W), and its peak memory equals 1F1B's."""
    m = pp * m_mult
    costs = uniform(pp, 1, f=1.0, b=1.0, w=1.0)
    zb = run_schedule("zero_bubble", pp, 1, m, costs)
    base = run_schedule("1f1b", pp, 1, m, costs)
    assert zb.makespan_s == pytest.approx(3 * m + pp - 1)
    assert zb.bubble_ratio == pytest.approx(closed_form_bubble("zero_bubble", pp, 1, m))
    assert zb.bubble_s[0] == pytest.approx(base.bubble_s[0] / 3)
    assert zb.max_peak_activation_bytes == pytest.approx(base.max_peak_activation_bytes)


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 9])
def test_zbv_matches_closed_form(pp, extra):
    """F = B = W per chunk, m >= 2p-1: only the (p-1)-chunk-forward ramp remains, the lower bound."""
    m = 2 * pp - 1 + extra
    costs = uniform(pp, 2)
    res = run_schedule("zbv", pp, 2, m, costs)
    assert res.bubble_ratio == pytest.approx(closed_form_bubble("zbv", pp, 2, m), rel=1e-9)
    assert res.makespan_s == pytest.approx(lower_bound_s(pp, 2, "v", m, costs))


def test_closed_form_bubble_domain():
    assert closed_form_bubble("v_half", 4, 2, 8) is None and closed_form_bubble("ilp", 4, 1, 8) is None
    with pytest.raises(InvalidConfigError, match="2\\*pp - 1"):
        closed_form_bubble("zbv", 4, 2, 6)
    with pytest.raises(InvalidConfigError, match="vpp=1"):
        closed_form_bubble("1f1b", 4, 2, 8)


# ---------------------------------------------------------------- every schedule: contract
SIZES = [(1, 1), (1, 3), (2, 1), (2, 5), (4, 2), (4, 4), (4, 9), (8, 8), (8, 17)]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("pp,m", SIZES)
def test_schedule_contract(name, pp, m):
    """Every op once, never faster than the critical-path bound, bubbles >= 0, timeline consistent."""
    vpp = VPP_OF[name]
    if SCHEDULES[name].problems(pp, vpp, m):
        pytest.skip("not applicable")
    costs = uniform(pp, vpp, f=1.0, b=1.3, w=0.8, p2p=0.05)
    res = run_schedule(name, pp, vpp, m, costs)
    assert_every_op_once(res)
    assert res.makespan_s >= lower_bound_s(pp, vpp, SCHEDULES[name].layout, m, costs) - 1e-9
    assert res.makespan_s >= max(res.busy_s) - 1e-9
    assert all(b >= -1e-9 for b in res.bubble_s)
    for r in range(pp):
        ends = res.end_s[r]
        starts = res.start_s[r]
        assert all(starts[i + 1] >= ends[i] - 1e-12 for i in range(len(starts) - 1))
    assert res.approximate == (SCHEDULES[name].approximate or (name == "ilp" and res.approximate))


@pytest.mark.parametrize("name", ALL)
def test_pp1_is_sequential(name):
    vpp = VPP_OF[name]
    costs = uniform(1, vpp, f=1.0, b=2.0, w=0.5)
    res = run_schedule(name, 1, vpp, 4, costs)
    assert res.makespan_s == pytest.approx(4 * 3.5)
    assert res.bubble_s == (pytest.approx(0.0),)


def test_microbatches_fewer_than_pp():
    for name in ("1f1b", "zero_bubble", "ilp", "zbv", "zbv_greedy", "v_half", "v_min"):
        vpp = VPP_OF[name]
        res = run_schedule(name, 8, vpp, 3, uniform(8, vpp))
        assert_every_op_once(res)
    assert run_schedule("1f1b", 8, 1, 3, uniform(8, 1)).peak_in_flight[0] == 3


@pytest.mark.parametrize("name", ["zbv", "zbv_greedy", "v_half", "v_min"])
def test_v_schedules_reject_vpp1(name):
    with pytest.raises(ValueError, match="V-shape schedule and needs vpp=2"):
        run_schedule(name, 4, 1, 8, uniform(4, 1))


def test_vpp_rules_and_unknown_names():
    with pytest.raises(ValueError, match="needs vpp=1"):
        run_schedule("1f1b", 4, 2, 8, uniform(4, 2))
    with pytest.raises(ValueError, match="vpp >= 2"):
        run_schedule("interleaved", 4, 1, 8, uniform(4, 1))
    with pytest.raises(UnknownComponentError, match="valid: 1f1b"):
        run_schedule("gpipe", 4, 1, 8, uniform(4, 1))
    assert applicable_schedules(8, 1) == ["1f1b", "zero_bubble", "ilp"]
    assert applicable_schedules(8, 2) == ["interleaved", "zbv", "zbv_greedy", "v_half", "v_min"]
    assert applicable_schedules(8, 4) == ["interleaved"]
    assert applicable_schedules(8, 2, num_microbatches=4) == ["zbv", "zbv_greedy", "v_half", "v_min"]


def test_registry_rejects_duplicate_names():
    with pytest.raises(ValueError, match="already registered"):
        register("1f1b", layout="interleaved", splits_bw=False, vpp_rule="one",
                 in_flight=lambda pp, vpp, m, r: 1.0)(lambda pp, vpp, m: [])


def test_costs_shape_must_match():
    with pytest.raises(InvalidConfigError, match="costs are for pp=4, vpp=1"):
        run_schedule("1f1b", 8, 1, 8, uniform(4, 1))


# ---------------------------------------------------------------- simulator semantics
def test_deadlocking_order_raises_naming_the_stuck_ops():
    order = [[Op("F", 0), Op("BW", 0), Op("F", 1), Op("BW", 1)],
             [Op("F", 1), Op("BW", 1), Op("F", 0), Op("BW", 0)]]
    with pytest.raises(ValueError, match=r"deadlock.*rank 0 stuck at op #1 BW0.0.*rank 1 stuck at op #0 F1.0"):
        simulate(order, 2, 1, "interleaved", 2, uniform(2, 1))
    # a rank waiting on its own later op
    with pytest.raises(P.ScheduleDeadlockError):
        simulate([[Op("BW", 0), Op("F", 0)]], 1, 1, "interleaved", 1, uniform(1, 1))


def test_malformed_orders_are_rejected():
    good = [[Op("F", 0), Op("BW", 0)], [Op("F", 0), Op("BW", 0)]]
    simulate(good, 2, 1, "interleaved", 1, uniform(2, 1))
    with pytest.raises(InvalidConfigError, match="appears 2 times"):
        simulate([good[0] + [Op("F", 0)], good[1]], 2, 1, "interleaved", 1, uniform(2, 1))
    with pytest.raises(InvalidConfigError, match="needs one BW or one B and one W"):
        simulate([[Op("F", 0), Op("B", 0)], good[1]], 2, 1, "interleaved", 1, uniform(2, 1))
    with pytest.raises(InvalidConfigError, match="invalid op"):
        simulate([[Op("F", 5), Op("BW", 0)], good[1]], 2, 1, "interleaved", 1, uniform(2, 1))


def test_p2p_sits_on_the_dependency_edge_and_same_rank_turn_is_free():
    # pp=2, m=1 1F1B: F(r0) -> p2p -> F(r1) -> BW(r1) -> p2p -> BW(r0)
    res = run_schedule("1f1b", 2, 1, 1, StageCosts.uniform(pp=2, f_s=1.0, b_s=2.0, p2p_s=0.25))
    assert res.makespan_s == pytest.approx(1 + 0.25 + 1 + 2 + 0.25 + 2)
    # V layout, pp=1: stages 0 and 1 both on rank 0, so the 1.0 s boundary is never paid
    order = [[Op("F", 0, 0), Op("F", 0, 1), Op("BW", 0, 1), Op("BW", 0, 0)]]
    res = simulate(order, 1, 2, "v", 1, StageCosts.uniform(pp=1, vpp=2, f_s=1.0, b_s=1.0, p2p_s=1.0))
    assert res.makespan_s == pytest.approx(4.0)


def test_per_boundary_p2p():
    costs = StageCosts.uniform(pp=3, f_s=1.0, b_s=1.0)
    slow_last = StageCosts(f_s=costs.f_s, b_s=costs.b_s, w_s=costs.w_s, act_bytes=costs.act_bytes, p2p_s=(0.0, 0.5))
    # m=1: the chain crosses boundary 1 twice (F down, B up)
    assert run_schedule("1f1b", 3, 1, 1, slow_last).makespan_s == pytest.approx(6.0 + 1.0)


def test_memory_model_split_release():
    """B frees b_release_fraction, W the rest: with fraction 1.0 ZB-H1 matches 1F1B rank by rank."""
    pp, m = 4, 8
    full = run_schedule("zero_bubble", pp, 1, m, uniform(pp, 1, frac=1.0))
    base = run_schedule("1f1b", pp, 1, m, uniform(pp, 1, frac=1.0))
    assert full.peak_activation_bytes == pytest.approx(base.peak_activation_bytes)
    half = run_schedule("zero_bubble", pp, 1, m, uniform(pp, 1, frac=0.5))
    # rank r defers r W's, each keeping half a micro-batch: pp - r + r/2
    assert half.peak_activation_bytes == pytest.approx(tuple(pp - r + r / 2 for r in range(pp)))


def test_v_schedules_memory_bounds():
    pp, m = 8, 32
    base = run_schedule("1f1b", pp, 1, m, uniform(pp, 1)).max_peak_activation_bytes
    costs = uniform(pp, 2, p2p=0.02)
    assert run_schedule("zbv", pp, 2, m, costs).max_peak_activation_bytes == pytest.approx(base)
    assert run_schedule("zbv_greedy", pp, 2, m, costs).max_peak_activation_bytes <= base + 1e-9
    assert run_schedule("v_half", pp, 2, m, costs).max_peak_activation_bytes <= 0.5 * base + 1e-9
    v_min = run_schedule("v_min", pp, 2, m, costs).max_peak_activation_bytes
    assert v_min < 0.5 * base
    # ~1/3 of 1F1B plus a constant: 4*pp/6 + O(1) chunk activations
    big = run_schedule("v_min", 16, 2, 64, uniform(16, 2)).max_peak_activation_bytes
    assert big / run_schedule("1f1b", 16, 1, 64, uniform(16, 1)).max_peak_activation_bytes < 0.4


# ---------------------------------------------------------------- paper Table 6 (Llama2-7B-like, PP=8)
def llama2_7b_like(vpp: int, layout: str = "interleaved") -> StageCosts:
    """32 layers on PP=8; per layer f = b = w = 1 (f:b:w ~ 1:1:1), one activation unit per layer, and
    a p2p of 0.13 of a layer forward (32 MiB at ~50 GB/s = 0.67 ms against ~5 ms per layer on an MI300X)."""
    n_stages = 8 * vpp
    per = 32 / n_stages
    ones = [per] * n_stages
    return StageCosts.from_virtual_stages(layout=layout, pp=8, vpp=vpp, f_s=ones, b_s=ones, w_s=ones,
                                          act_bytes=ones, p2p_s=0.13)


def test_table6_ordering():
    """Paper Table 6 (MI300X, Llama2-7B, PP=8): ZeroBubble 1.13x, ZBV 1.12x, Interleaved 1.09x over
    1F1B; V-half and V-min below 1F1B's memory. The exact simulator gives ZB 1.15x and
    interleaved 1.11x; ZB-V comes out *ahead* of ZB-H1 (1.19x): with F=B=W its bubble is
    (p-1)/(6m) against ZB-H1's (p-1)/(3m) (see the closed-form tests), so the paper's 0.6% gap the
    other way is not a property of the schedules (docs/pipeline.md). We check ZB and ZBV within 5%
    of each other instead of an order."""
    res = {(r.schedule, r.vpp): r for r in compare_schedules(8, [1, 2], 32, llama2_7b_like)}
    span = {k[0]: r.makespan_s for k, r in res.items()}
    assert span["zbv"] < span["interleaved"] < span["1f1b"]
    assert span["zero_bubble"] < span["interleaved"]
    assert abs(span["zero_bubble"] - span["zbv"]) / span["zbv"] < 0.05
    assert span["1f1b"] / span["zero_bubble"] == pytest.approx(1.13, abs=0.02)
    assert span["1f1b"] / span["interleaved"] == pytest.approx(1.09, abs=0.02)
    assert span["ilp"] <= span["zero_bubble"] + 1e-9
    mem_1f1b = res[("1f1b", 1)].max_peak_activation_bytes
    assert res[("v_half", 2)].max_peak_activation_bytes < mem_1f1b
    assert res[("v_min", 2)].max_peak_activation_bytes < mem_1f1b
    assert span["v_half"] < span["1f1b"]


def test_compare_schedules_runs_everything_applicable_with_1f1b_first():
    calls = []

    def costs_for(vpp, layout="interleaved"):
        calls.append((vpp, layout))
        return uniform(4, vpp)

    results = compare_schedules(4, [1, 2, 3], 8, costs_for)
    names = [(r.schedule, r.vpp) for r in results]
    assert names[0] == ("1f1b", 1)
    assert set(names) == {("1f1b", 1), ("zero_bubble", 1), ("ilp", 1), ("interleaved", 2), ("interleaved", 3),
                          ("zbv", 2), ("zbv_greedy", 2), ("v_half", 2), ("v_min", 2)}
    assert (2, "v") in calls and (2, "interleaved") in calls
    # a plain costs_for(vpp) works too; vpp=1 schedules always run
    assert [r.schedule for r in compare_schedules(4, [4], 8, lambda vpp: uniform(4, vpp))] == \
        ["1f1b", "interleaved", "zero_bubble", "ilp"]


# ---------------------------------------------------------------- ILP
def test_ilp_beats_zero_bubble_on_heterogeneous_costs_and_reports_optimality():
    costs = StageCosts(f_s=[[1.0], [1.4], [0.8], [1.2]], b_s=[[1.1], [2.0], [0.9], [1.6]],
                       w_s=[[0.4], [1.3], [0.5], [1.0]], act_bytes=[[1.0]] * 4, p2p_s=0.1)
    ilp = run_schedule("ilp", 4, 1, 8, costs)
    zb = run_schedule("zero_bubble", 4, 1, 8, costs)
    assert ilp.makespan_s <= zb.makespan_s + 1e-9
    assert not ilp.approximate and "optimal" in ilp.note
    assert ilp.max_peak_activation_bytes <= zb.max_peak_activation_bytes + 1e-9


def test_ilp_size_bound_falls_back_and_says_so():
    from oracle.pipeline.schedules import ilp as ilp_mod
    tiny = ilp_mod.IlpBudget(max_ops=10, node_limit=10, safety_time_limit_s=60.0)
    sol = ilp_mod.solve_w_placement(4, 8, uniform(4, 1), budget=tiny)
    assert not sol.optimal and "max_ops=10" in sol.note and not sol.time_capped


# ---------------------------------------------------------------- output
def test_result_dict_has_the_timeline():
    res = run_schedule("zbv", 4, 2, 8, uniform(4, 2, p2p=0.02))  # drawn by raytune_primus.plots.gantt
    assert res.to_dict()["schedule"] == "zbv" and len(res.timeline) == 4 * 8 * 6


def test_package_never_imports_ray_or_torch():
    code = ("import sys, oracle.pipeline; "
            "bad = [m for m in ('ray', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(P.__file__).rsplit("/oracle/", 1)[0])


# ---------------------------------------------------------------- blocking sends
def test_send_times_skip_the_pipeline_ends_and_the_v_turn():
    c = StageCosts.uniform(pp=3, vpp=2, f_s=1.0, b_s=1.0, p2p_s=0.25)
    v = c.send_s("v")  # stages: r0c0, r1c0, r2c0 | r2c1, r1c1, r0c1
    assert v[0][0] == (0.25, 0.0)      # first stage: sends forward only
    assert v[2][0] == (0.0, 0.25)      # the V turn (r2c0 -> r2c1) is on the same rank: free
    assert v[2][1] == (0.25, 0.0)
    assert v[0][1] == (0.0, 0.25)      # last stage: sends its gradient back only
    inter = StageCosts.uniform(pp=3, vpp=2, f_s=1.0, b_s=1.0, p2p_s=0.25).send_s("interleaved")
    assert inter[2][0] == (0.25, 0.25)  # r2c0 -> r0c1 crosses the wire in the interleaved map


@pytest.mark.parametrize("name,vpp", [("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1), ("zbv", 2)])
@pytest.mark.parametrize("m", [4, 8, 13])
def test_blocking_sends_hold_the_sender(name, vpp, m):
    pp, d = 4, 0.3
    layout = P.get_schedule(name).layout
    asyn = uniform(pp, vpp, f=1.0, b=1.2, w=0.8, p2p=d)
    block = dataclasses.replace(asyn, p2p_blocking=True)
    ra, rb = run_schedule(name, pp, vpp, m, asyn), run_schedule(name, pp, vpp, m, block)
    assert rb.makespan_s >= ra.makespan_s - 1e-9          # holding the sender never helps
    assert rb.busy_s == ra.busy_s                         # busy stays compute-only; the hold shows as idle
    send = block.send_s(layout)
    for r in range(pp):                                   # every op lasts its cost plus its own send
        for op, s, e in zip(rb.order[r], rb.start_s[r], rb.end_s[r]):
            cost = {"F": asyn.f_s, "B": asyn.b_s, "W": asyn.w_s}.get(op.kind)
            base = cost[r][op.chunk] if cost else asyn.b_s[r][op.chunk] + asyn.w_s[r][op.chunk]
            held = {"F": send[r][op.chunk][0], "W": 0.0}.get(op.kind, send[r][op.chunk][1])
            assert e - s == pytest.approx(base + held)
    zero = dataclasses.replace(block, p2p_s=0.0)
    assert run_schedule(name, pp, vpp, m, zero).makespan_s == pytest.approx(
        run_schedule(name, pp, vpp, m, dataclasses.replace(asyn, p2p_s=0.0)).makespan_s)


def test_1f1b_is_the_blocking_schedule():
    assert P.get_schedule("1f1b").blocking_p2p
    assert not any(P.get_schedule(n).blocking_p2p for n in ("interleaved", "zero_bubble", "zbv", "ilp"))


def test_quantized_plan_costs_keep_everything_but_the_rounding():
    c = dataclasses.replace(StageCosts(f_s=((1.03,), (0.97,)), b_s=((2.01,), (1.99,)), w_s=((0.5,), (0.51,)),
                                       act_bytes=((3.0,), (2.0,)), p2p_s=(0.013,), b_release_fraction=0.3),
                            p2p_blocking=True)
    q = P.quantized(c)
    assert q.p2p_blocking and q.b_release_fraction == 0.3 and q.act_bytes == c.act_bytes
    step = 2.01 / 32  # the top cost over the default resolution (steps=32)
    for a, b in ((c.f_s, q.f_s), (c.b_s, q.b_s), (c.w_s, q.w_s)):
        for ra, rb in zip(a, b):
            assert all(abs(x - y) <= step / 2 + 1e-12 for x, y in zip(ra, rb))
    assert P.quantized(c) == q  # equal costs plan once (the cache key)


@pytest.mark.parametrize("name", [n for n in ALL if not SCHEDULES[n].cost_aware])
def test_a_replay_without_the_timeline_gives_the_same_makespan_busy_times_and_memory(name):
    vpp = VPP_OF[name]
    costs = StageCosts(f_s=((1.0,) * vpp, (1.3,) * vpp, (0.9,) * vpp, (1.1,) * vpp),
                       b_s=((2.0,) * vpp, (2.2,) * vpp, (1.7,) * vpp, (2.4,) * vpp),
                       w_s=((0.5,) * vpp, (0.7,) * vpp, (0.4,) * vpp, (0.6,) * vpp),
                       act_bytes=((1.0 / vpp,) * vpp,) * 4, p2p_s=0.05)
    full = run_schedule(name, 4, vpp, 8, costs)
    lean = run_schedule(name, 4, vpp, 8, costs, timeline=False)
    assert (lean.makespan_s, lean.busy_s, lean.peak_activation_bytes) == (
        full.makespan_s, full.busy_s, full.peak_activation_bytes)
    assert lean.start_s == ((),) * 4 and lean.end_s == ((),) * 4
    assert max(max(e) for e in full.end_s) == pytest.approx(full.makespan_s)
