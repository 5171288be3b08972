"""The vectorised order compiler and array builders against the per-op reference path (bit-identical)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oracle.errors import InvalidConfigError
from oracle.pipeline import Op, ScheduleDeadlockError, StageCosts, run_compiled, run_schedule
from oracle.pipeline import _jit
from oracle.pipeline.fast_compile import _KINDS, array_to_ops, compile_arrays, fold_columns
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline.simulator import (CompiledOrder, compile_order, compile_order_arrays,
                                       compile_order_reference, fold_steps, ops_to_array)
from tests.oracle.test_pipeline_jit import jit, use
from tests.oracle.test_pipeline_properties import SETTINGS, costs_st

ARRAY_BUILT = tuple(name for name, spec in SCHEDULES.items() if spec.builds_arrays)
FIXED = tuple(name for name, spec in SCHEDULES.items() if not spec.cost_aware)
ARRAY_FIELDS = ("mem_row_rank", "mem_alive", "mem_b", "mem_w", "mem_segments")
PLAIN_FIELDS = ("pp", "vpp", "layout", "num_microbatches", "order", "flat", "rank_offsets", "n_keys",
                "op_counts", "peak_in_flight", "splits_bw")


def _sizes(draw, name: str, pp_max: int = 6) -> tuple[int, int, int]:
    spec = SCHEDULES[name]
    pp = draw(st.integers(1, pp_max))
    vpp = {"one": 1, "two": 2}.get(spec.vpp_rule) or draw(st.integers(2, 4))
    least = spec.min_microbatches(pp, vpp) if spec.min_microbatches else 1
    return pp, vpp, draw(st.integers(least, max(least, 3 * pp + 2)))


def assert_same_plan(fast: CompiledOrder, ref: CompiledOrder) -> None:
    """Same tables; the evaluation order may differ (any topological order gives the same times)."""
    for f in PLAIN_FIELDS:
        if f != "flat":
            assert getattr(fast, f) == getattr(ref, f), f
    assert sorted(fast.flat) == sorted(ref.flat)
    for f in ARRAY_FIELDS:
        a, b = getattr(fast, f), getattr(ref, f)
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), f


def assert_topological(plan: CompiledOrder) -> None:
    """Every op after its dependencies and its rank predecessor in the evaluation order."""
    done_keys: set[int] = set()
    done_slots: set[int] = set()
    firsts = set(plan.rank_offsets[:-1])
    for r, slot, key, d1, _, d2, _ in plan.flat:
        assert d1 < 0 or d1 in done_keys
        assert d2 < 0 or d2 in done_keys
        assert slot in firsts or slot - 1 in done_slots
        done_keys.add(key)
        done_slots.add(slot)
    assert len(done_slots) == plan.rank_offsets[-1]


@st.composite
def schedule_case(draw, names=FIXED):
    name = draw(st.sampled_from(names))
    pp, vpp, m = _sizes(draw, name)
    costs = draw(costs_st(pp, vpp))
    if draw(st.booleans()):
        costs = StageCosts(f_s=costs.f_s, b_s=costs.b_s, w_s=costs.w_s, act_bytes=costs.act_bytes,
                           p2p_s=costs.p2p_s, b_release_fraction=costs.b_release_fraction, p2p_blocking=True)
    return name, pp, vpp, m, costs


@SETTINGS
@given(schedule_case())
def test_fast_compile_equals_the_reference_on_every_fixed_schedule(case):
    """Unequal per-stage f/b/w, per-boundary p2p, blocking or not: identical tables and results."""
    name, pp, vpp, m, costs = case
    spec = SCHEDULES[name]
    order = spec.make(pp, vpp, m).order
    ref = compile_order_reference(order, pp, vpp, spec.layout, m)
    fast = compile_order(order, pp, vpp, spec.layout, m)
    assert_same_plan(fast, ref)
    assert_topological(fast)
    assert run_compiled(fast, costs, name=name) == run_compiled(ref, costs, name=name)
    # and through the plan cache (array builders where the schedule has one)
    res = run_schedule(name, pp, vpp, m, costs)
    assert res == run_compiled(ref, costs, name=name, approximate=res.approximate, note=res.note)


def array_and_reference_plans(name: str, pp: int, vpp: int, m: int) -> tuple[CompiledOrder, CompiledOrder]:
    """The plan from the array builder (vectorised compile) and from the op-list builder (reference
    compile), after checking that the two builders give the same ops, approximate flag and note."""
    spec = SCHEDULES[name]
    built, fast = spec.make(pp, vpp, m), spec.make_fast(pp, vpp, m)
    assert [list(ops) for ops in built.order] == [list(array_to_ops(a, vpp)) for a in fast.order]
    assert (built.approximate, built.note) == (fast.approximate, fast.note)
    return (compile_order_arrays(fast.order, pp, vpp, spec.layout, m),
            compile_order_reference(built.order, pp, vpp, spec.layout, m))


@SETTINGS
@given(st.data())
def test_array_builders_equal_the_op_list_builders(data):
    name = data.draw(st.sampled_from(ARRAY_BUILT))
    pp, vpp, m = _sizes(data.draw, name, pp_max=12)
    fast, ref = array_and_reference_plans(name, pp, vpp, m)
    assert_same_plan(fast, ref)
    # the array compiler's folded chain and rank tails (numpy) are the step-by-step fold of its own steps
    chain, tails = fold_steps(tuple(fast.steps), pp)
    assert (fast.chain, fast.tails) == (chain, tails)
    # ... and the arrays the compiled replay reads (no tuples made) are the same steps
    assert fast.chain_arrays[0].tolist() == [list(step) for step in chain]
    assert fast.chain_arrays[1].tolist() == [list(tail) for tail in tails]


@pytest.mark.parametrize("name,pp,vpp,m", [("1f1b", 32, 1, 512), ("interleaved", 16, 3, 256),
                                          ("zero_bubble", 32, 1, 64), ("zbv", 16, 2, 256),
                                          ("interleaved", 8, 2, 13)])
def test_large_plans_match_the_reference(name, pp, vpp, m):
    """The search space's big shapes (pp 16/32, hundreds of micro-batches), uneven stage costs."""
    spec = SCHEDULES[name]
    rng = np.random.default_rng(pp * m)

    def mat():
        return rng.uniform(0.1, 2.0, size=(pp, vpp)).tolist()
    costs = StageCosts(f_s=mat(), b_s=mat(), w_s=mat(), act_bytes=mat(),
                       p2p_s=tuple(rng.uniform(0, 0.05, pp * vpp - 1).tolist()), p2p_blocking=spec.blocking_p2p)
    fast, ref = array_and_reference_plans(name, pp, vpp, m)
    assert_same_plan(fast, ref)
    assert run_compiled(fast, costs) == run_compiled(ref, costs)


def _shuffled(data, name: str, pp: int, vpp: int, m: int) -> list[list[Op]]:
    """Schedule ``name``'s order with random swaps of adjacent ops, maybe rank 0 permuted (mostly deadlocks)
    and maybe the last rank's last op replaced by a duplicate F (malformed)."""
    order = [list(ops) for ops in SCHEDULES[name].make(pp, vpp, m).order]
    for r in range(pp):
        for _ in range(data.draw(st.integers(0, 3))):
            if len(order[r]) > 1:
                i = data.draw(st.integers(0, len(order[r]) - 2))
                order[r][i], order[r][i + 1] = order[r][i + 1], order[r][i]
    if data.draw(st.booleans()):
        order[0] = data.draw(st.permutations(order[0]))
    if data.draw(st.booleans()) and order[-1]:
        order[-1] = order[-1][:-1] + [Op("F", 0, 0)]  # a duplicate F and a missing op
    return order


@SETTINGS
@given(st.data())
def test_shuffled_orders_agree_with_the_reference_or_raise_the_same_error(data):
    """Random per-rank permutations (mostly deadlocks) and random swaps of adjacent ops."""
    name = data.draw(st.sampled_from(FIXED))
    pp, vpp, m = _sizes(data.draw, name, pp_max=4)
    spec = SCHEDULES[name]
    order = _shuffled(data, name, pp, vpp, m)
    costs = data.draw(costs_st(pp, vpp))
    try:
        ref = compile_order_reference(order, pp, vpp, spec.layout, m)
    except (InvalidConfigError, ScheduleDeadlockError) as err:
        with pytest.raises(type(err)) as got:
            compile_order(order, pp, vpp, spec.layout, m)
        assert str(got.value) == str(err)
        return
    fast = compile_order(order, pp, vpp, spec.layout, m)
    assert_same_plan(fast, ref)
    assert_topological(fast)
    assert run_compiled(fast, costs) == run_compiled(ref, costs)


def _compiled_fields(arrays: list[np.ndarray], pp: int, vpp: int, layout: str, m: int) -> dict | None:
    """compile_arrays' fields, each as comparable plain data (None: not accepted)."""
    fields = compile_arrays(arrays, pp, vpp, layout, m)
    if fields is None:
        return None
    out = {k: v for k, v in fields.items() if k not in ("chain", "order", "steps", "chain_arrays", "step_slots")
           and not isinstance(v, np.ndarray)}
    out.update({k: (v.dtype.str, v.shape, v.tobytes()) for k, v in fields.items() if isinstance(v, np.ndarray)})
    out["chain_arrays"] = [(a.dtype.str, a.shape, a.tobytes()) for a in fields["chain_arrays"]]
    out["step_slots"] = fields["step_slots"].tolist()
    out["chain"], out["steps"], out["order"] = tuple(fields["chain"]), tuple(fields["steps"]), tuple(fields["order"])
    return out


@SETTINGS
@given(st.data())
def test_the_c_compile_kernels_give_numpys_plan_exactly(data):
    """``_native.compile_core``, ``tick_order`` and ``fold_chain`` (``RAYTUNE_PRIMUS_JIT`` auto) against the numpy
    passes, relaxation and fold (``off``): the same per-op tables, memory samples, evaluation order, chain and
    tails, byte for byte, or both refuse the order (a deadlock, a malformed order), on shuffled orders of every
    fixed schedule and on the big shapes."""
    use("native")
    name = data.draw(st.sampled_from(FIXED))
    pp, vpp, m = _sizes(data.draw, name, pp_max=8)
    order = _shuffled(data, name, pp, vpp, m) if data.draw(st.booleans()) else SCHEDULES[name].make(pp, vpp, m).order
    arrays = [ops_to_array(ops) for ops in order]
    if any(a is None for a in arrays):
        return
    got = {}
    for mode in ("off", "auto"):
        with jit(mode):
            got[mode] = _compiled_fields(arrays, pp, vpp, SCHEDULES[name].layout, m)
    assert got["auto"] == got["off"]


@pytest.mark.parametrize("name,pp,vpp,m", [("1f1b", 32, 1, 512), ("interleaved", 16, 3, 256), ("zbv", 16, 2, 256)])
def test_the_c_compile_kernels_on_big_plans(name, pp, vpp, m):
    use("native")
    arrays = list(SCHEDULES[name].make_fast(pp, vpp, m).order)
    got = {}
    for mode in ("off", "auto"):
        with jit(mode):
            got[mode] = _compiled_fields(arrays, pp, vpp, SCHEDULES[name].layout, m)
    assert got["auto"] is not None and got["auto"] == got["off"]


def test_the_c_compile_kernels_refuse_bad_input():
    use("native")
    ext = _jit.extension()
    one = np.zeros(2, dtype=np.int64)
    perm = np.empty(2, dtype=np.int64)
    offsets = np.array([0, 2], dtype=np.int64)
    own = np.array([0, 1], dtype=np.int64)
    no_dep = np.full(2, -1, dtype=np.int64)
    assert ext.tick_order(own, no_dep, no_dep, offsets, 2, perm) and perm.tolist() == [0, 1]
    waits_on_next = np.array([1, -1], dtype=np.int64)
    assert not ext.tick_order(own, waits_on_next, no_dep, offsets, 2, perm)  # a deadlock
    with pytest.raises(IndexError, match="op 1 owns key 5, out of range"):
        ext.tick_order(np.array([0, 5], dtype=np.int64), no_dep, no_dep, offsets, 2, perm)
    with pytest.raises(ValueError, match="offsets must run from 0 to the op count"):
        ext.tick_order(own, no_dep, no_dep, np.array([0, 3], dtype=np.int64), 2, perm)
    with pytest.raises(TypeError, match="tick_order: perm must be a C-contiguous writable int64 array"):
        ext.tick_order(own, no_dep, no_dep, offsets, 2, perm.astype(np.float64))
    chain, tails = np.empty((2, 6), dtype=np.int64), np.empty((1, 2), dtype=np.int64)
    # two ops no other rank waits for: the first a step of its own, the last folded into the rank's tail
    assert ext.fold_chain(one, own, no_dep, no_dep, one, np.array([0, 1], dtype=np.int64), offsets, 2, chain,
                          tails) == 1
    assert chain[:1].tolist() == [[0, -1, -1, -1, -1, 0]] and tails.tolist() == [[0, 0]]
    with jit("off"):
        folded, numpy_tails = fold_columns(one, own, no_dep, no_dep, one, np.array([0, 1]), offsets, 2)
    assert folded.array.tolist() == chain[:1].tolist() and numpy_tails == ((0, 0),)
    with pytest.raises(ValueError, match="perm must be a permutation of the op slots"):
        ext.fold_chain(one, own, no_dep, no_dep, one, np.array([0, 0], dtype=np.int64), offsets, 2, chain, tails)
    with pytest.raises(IndexError, match="op 1 has a key or rank out of range"):
        ext.fold_chain(np.array([0, 3], dtype=np.int64), own, no_dep, no_dep, one, perm, offsets, 2, chain, tails)
    with pytest.raises(ValueError, match="tails pp rows of 2"):
        ext.fold_chain(one, own, no_dep, no_dep, one, perm, offsets, 2, chain, np.empty((2, 2), dtype=np.int64))
    # compile_core: one rank, one micro-batch, F then BW; a second F in the cell is refused (-1: the reference path)
    ops = np.array([[0, 0, 0], [3, 0, 0]], dtype=np.int64)
    outs = [np.empty(2, dtype=np.int64) for _ in range(6)] + [np.empty((1, 1)) for _ in range(3)] + [
        np.empty(1, dtype=np.int64), np.empty(4, dtype=np.int64), np.empty(1, dtype=np.int64)]
    maps = (np.array([0], dtype=np.int64), np.array([0], dtype=np.int64))
    kinds = _KINDS
    assert ext.compile_core(ops, offsets, 1, 1, *maps, kinds, *outs) == 0
    assert outs[1].tolist() == [0, 1] and outs[2].tolist() == [-1, 0]  # keys F(0), B(0); BW waits on its F
    assert outs[6].tolist() == [[1.0]] and outs[-2].tolist() == [1, 0, 0, 1] and outs[-1].tolist() == [1]
    assert ext.compile_core(np.array([[0, 0, 0], [0, 0, 0]], dtype=np.int64), offsets, 1, 1, *maps, kinds, *outs) == -1
    with pytest.raises(ValueError, match="too large"):
        ext.compile_core(ops, offsets, 2 ** 62, 1, *maps, kinds, *outs)
    with pytest.raises(ValueError, match="an output or map has the wrong size"):
        ext.compile_core(ops, offsets, 1, 1, *maps, kinds, *outs[:-1], np.empty(2, dtype=np.int64))
    with pytest.raises(TypeError, match="compile_core: mem_alive must be a C-contiguous writable float64 array"):
        ext.compile_core(ops, offsets, 1, 1, *maps, kinds, *outs[:6], np.empty(1, dtype=np.int64), *outs[7:])


@pytest.mark.parametrize("extension_at_read", [True, False])
def test_a_c_compiled_plan_computes_its_steps_again_when_read(monkeypatch, extension_at_read):
    """The C compile keeps no per-op columns in the plan; its steps (a timeline's) are computed again on first
    read, with the extension or, where it is not loaded (a plan unpickled elsewhere), with numpy: the same rows."""
    use("native")
    name, pp, vpp, m = "interleaved", 3, 2, 6
    arrays = list(SCHEDULES[name].make_fast(pp, vpp, m).order)
    with jit("off"):
        want = compile_arrays(arrays, pp, vpp, SCHEDULES[name].layout, m)
    with jit("auto"):
        got = compile_arrays(arrays, pp, vpp, SCHEDULES[name].layout, m)
    if not extension_at_read:
        monkeypatch.setattr(_jit, "_NATIVE", {"ext": None})
    assert tuple(got["steps"]) == tuple(want["steps"]) and len(got["steps"]) == len(want["steps"])


_garbage = st.lists(st.integers(-3, 12), min_size=0, max_size=36)


@SETTINGS
@given(st.data())
def test_the_c_kernels_answer_or_raise_on_any_small_input(data):
    """Arbitrary small int arrays and sizes into every C entry point: each returns or raises a Python error,
    never reads or writes outside an array (a crash would end the test run)."""
    use("native")
    ext = _jit.extension()

    def arr(*shape_tail: int) -> np.ndarray:
        vals = data.draw(_garbage)
        width = shape_tail[0] if shape_tail else 1
        vals = vals[:len(vals) - len(vals) % width]
        return np.array(vals, dtype=np.int64).reshape((-1, *shape_tail))
    n_keys = data.draw(st.integers(-1, 12))
    offsets = np.array(sorted(data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))), dtype=np.int64)
    n = int(offsets[-1]) if len(offsets) else 0
    cols = [np.array(data.draw(st.lists(st.integers(-3, 12), min_size=n, max_size=n)), dtype=np.int64)
            for _ in range(6)]
    calls = [
        lambda: ext.tick_order(cols[0], cols[1], cols[2], offsets, n_keys, np.empty(n, dtype=np.int64)),
        lambda: ext.fold_chain(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], offsets, n_keys,
                               np.empty((n, 6), dtype=np.int64), np.empty((max(0, len(offsets) - 1), 2),
                                                                          dtype=np.int64)),
        lambda: ext.prepared_span(ext.chain_prepare(arr(6), arr(2), n_keys) or ext.chain_prepare(
            np.zeros((0, 6), dtype=np.int64), np.zeros((1, 2), dtype=np.int64), 0),
            [0.5] * data.draw(st.integers(0, 6)), [0.1] * data.draw(st.integers(0, 6))),
    ]
    pp = max(1, len(offsets) - 1)
    vpp, m = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    cells = pp * vpp * m
    ops = np.array(data.draw(st.lists(st.integers(-1, 4), min_size=3 * n, max_size=3 * n)), dtype=np.int64)
    maps = [np.array(data.draw(st.lists(st.integers(-1, 7), min_size=pp * vpp, max_size=pp * vpp)), dtype=np.int64)
            for _ in range(2)]
    calls.append(lambda: ext.compile_core(
        ops.reshape(n, 3), offsets, m, vpp, *maps, _KINDS, *[np.empty(n, dtype=np.int64) for _ in range(6)],
        *[np.empty((cells, vpp)) for _ in range(3)], np.empty(cells, dtype=np.int64),
        np.empty(pp * 4 * vpp, dtype=np.int64), np.empty(pp, dtype=np.int64)))
    width = data.draw(st.sampled_from([-1, 0, 1, 2, 3, 2 ** 61, 2 ** 20 + 1]))
    live = np.array(data.draw(st.lists(st.floats(allow_nan=True), min_size=0, max_size=12)), dtype=np.float64)
    segs = np.array(data.draw(st.lists(st.integers(-2, 8), min_size=0, max_size=4)), dtype=np.int64)
    calls.append(lambda: ext.frontier(live, width, segs, np.empty(data.draw(st.integers(0, 12)), dtype=np.uint8)))
    calls.append(lambda: ext.frontier(live.reshape(-1, 1), 1, segs, np.empty(len(live), dtype=np.uint8)))
    rows = data.draw(st.integers(0, 40))
    calls.append(lambda: ext.zbv_order(n_keys, m, np.empty((rows, 3), dtype=np.int64)))
    calls.append(lambda: ext.zb_h1_order(pp, n_keys, np.empty((rows, 3), dtype=np.int64)))
    for call in calls:
        try:
            call()
        except (TypeError, ValueError, IndexError, MemoryError):
            pass


@pytest.mark.parametrize("name", ["zbv", "zero_bubble"])
def test_the_c_order_builders_equal_numpys(name):
    """ZB-V's and ZB-H1's orders built in C (``zbv_order``, ``zb_h1_order``, what ``make_fast`` runs where the
    extension is built) equal numpy's row for row, pp 1-33 and micro-batches 1-40 and a few large counts; the op-list
    builders equal both (test_array_builders_equal_the_op_list_builders, drawn)."""
    mode = use("native")
    from oracle.pipeline.schedules.zbv import rank_array
    from oracle.pipeline.schedules.zero_bubble import zb_h1_rows
    spec, vpp = SCHEDULES[name], 2 if name == "zbv" else 1
    with jit(mode):
        for pp in range(1, 34):
            for m in [*range(1, 41), 64, 257]:
                if name == "zbv":
                    want = np.concatenate([rank_array(pp, r, m) for r in range(pp)])
                else:
                    want = zb_h1_rows(pp, np.arange(pp), m)
                got = spec.make_fast(pp, vpp, m).order
                assert len(got) == pp and np.array_equal(np.concatenate(got), want), (pp, m)
        c_rows = np.concatenate(spec.make_fast(5, vpp, 11).order)
    with jit("off"):  # numpy's builders where the extension is off: the same rows
        assert np.array_equal(np.concatenate(spec.make_fast(5, vpp, 11).order), c_rows)
    ext = _jit.extension()
    fn = ext.zbv_order if name == "zbv" else ext.zb_h1_order
    with pytest.raises(ValueError, match="out must hold"):
        fn(2, 3, np.empty((5, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="pp and m must be"):
        fn(0, 3, np.empty((0, 3), dtype=np.int64))
