"""Schedule-agnostic event simulator: per-rank op orders + costs -> makespan, bubbles, memory.

Semantics (exact for the given orders; no time stepping):
- Each rank runs its op list in order, one op at a time; an op starts at
  ``max(rank free, every dependency's end + link latency)``.
- Dependencies, with ``v`` the op's virtual stage and ``V = pp * vpp``:
  ``F(mb, v)`` needs ``F(mb, v-1)`` (+ p2p of boundary v-1);
  ``B(mb, v)`` / ``BW(mb, v)`` needs ``B(mb, v+1)`` (+ p2p of boundary v; the last stage has none) and
  ``F(mb, v)``; ``W(mb, v)`` needs ``B(mb, v)``.
- Sends are asynchronous by default: the latency sits on the dependency edge, never on a compute
  stream. With ``costs.p2p_blocking`` (a runtime that waits on its send/recv before the next op,
  Megatron's non-interleaved 1F1B) the sending op holds its rank for the transfer instead and the
  consumer sees the data at that op's end. A boundary between two chunks of the same rank (the turn
  of a V) costs nothing either way.
- Memory depends on the order only: F adds ``act_bytes``; B frees ``b_release_fraction`` of it and W
  the rest; BW frees all of it. The peak is sampled after each F.

Compiling an order (cost-independent, cached by callers) yields flat integer tables and an
evaluation order in which every op follows its dependencies and its rank predecessor. The
vectorised compiler (``fast_compile``: numpy, the ops sorted by longest-path level) handles every
well-formed order; the reference compiler walks the order once as a list scheduler (a rank runs
until its next op misses a dependency, parks on it, and is woken when it completes) and is the one
that reports malformed orders and deadlocks (ScheduleDeadlockError names the parked ranks). Both give
the same tables and, since any such evaluation order gives the same times, bit-identical results.
The timed pass is one branch-light loop over the evaluation order: O(ops), no event queue.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oracle.errors import InvalidConfigError
from oracle.pipeline import _jit
from oracle.pipeline.fast_compile import KIND_CODES, compile_arrays, ops_to_array
from oracle.pipeline.types import (LAYOUTS, Layout, Op, PipelineResult, ScheduleDeadlockError, StageCosts,
                                   stage_map, virtual_stage)

_KIND_INDEX = {"F": 0, "B": 1, "W": 2, "BW": 3}
_DEP_CLASS = {"F": 0, "B": 1, "BW": 1, "W": 2}  # BW completes the "B" of its stage for its consumers


@dataclass(frozen=True, slots=True, eq=False)
class CompiledOrder:
    """An op order checked and turned into flat integer tables; reusable with any StageCosts."""

    pp: int
    vpp: int
    layout: Layout
    num_microbatches: int
    order: tuple[tuple[Op, ...], ...]
    steps: tuple[tuple[int, int, int, int, int, int], ...]
    """Every op once, in an order where its dependencies and its rank predecessor come first:
    (rank, key, dep1, boundary1, dep2, global cost index); -1 entries hit sentinels (finish time 0,
    latency 0), so the time pass has no branches on them."""
    step_slots: np.ndarray
    """Slot (rank offset + position in the rank's list) of each step's op: where its times go in a timeline."""
    rank_offsets: tuple[int, ...]
    """Slot of each rank's first op in the flat start/end arrays (plus the total at the end)."""
    n_keys: int
    op_counts: tuple[tuple[int, ...], ...]
    """Per rank, how many ops of each cost index (for busy time)."""
    mem_row_rank: np.ndarray
    """Rank of each memory sample (one sample after every F)."""
    mem_alive: np.ndarray
    """Per sample and chunk: F count minus BW count (micro-batches holding activations)."""
    mem_b: np.ndarray
    """Per sample and chunk: B count (each released ``b_release_fraction``)."""
    mem_w: np.ndarray
    """Per sample and chunk: W count (each released the rest)."""
    mem_segments: np.ndarray
    """First sample of each rank (for ``np.maximum.reduceat``)."""
    peak_in_flight: tuple[int, ...]
    """Peak micro-batch-chunks alive per rank (order-only)."""
    splits_bw: bool
    """True when the order uses separate B and W ops."""
    chain: tuple[tuple[int, int, int, int, int, int], ...] | None = field(default=None, repr=False)
    """The steps as the timed pass reads them: (key, rank predecessor's key, folded cost index, cross-rank
    dependency, its boundary, cost index). A dependency on the same rank (the op's own F or B, the turn
    of a V) finished no later than the rank predecessor, so it cannot set the start and is dropped (-1,
    the sentinel). An op no other rank waits for and with no cross-rank input (a W, stage 0's B, the
    last stage's F...) only delays its rank's next op: it is folded into that op as one cost added to
    the predecessor's end (one op at most, so the same float additions: bit-identical times).
    None at construction: folded from ``steps`` (:func:`fold_steps`); the vectorised compiler passes the
    same fold computed with numpy (``fast_compile.fold_columns``) as a ``LazyChain``: its array is
    ``chain_arrays[0]``, the tuples are made when the Python replay first reads them."""
    tails: tuple[tuple[int, int], ...] | None = field(default=None, repr=False)
    """Per rank (its last emitted key, a folded cost index after it): the rank's end."""
    chain_arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    """``chain`` and ``tails`` as int64 arrays, for the compiled replay (``_jit``); made when it first runs."""
    prepared: "_Prepared | None" = field(default=None, repr=False)
    """The chain as the compiled replay in use took it (``_jit.Replay.prepare``), made when it first runs."""

    def __post_init__(self) -> None:
        if self.chain is None or self.tails is None:
            chain, tails = fold_steps(self.steps, self.pp)
            object.__setattr__(self, "chain", chain)
            object.__setattr__(self, "tails", tails)

    @property
    def flat(self) -> tuple[tuple[int, int, int, int, int, int, int], ...]:
        """The steps with their slots: (rank, slot, key, dep1, boundary1, dep2, global cost index)."""
        return tuple((r, slot, *rest) for (r, *rest), slot in zip(self.steps, self.step_slots.tolist()))


def fold_steps(steps: Sequence[tuple[int, int, int, int, int, int]], pp: int
               ) -> tuple[tuple[tuple[int, int, int, int, int, int], ...], tuple[tuple[int, int], ...]]:
    """(chain, tails) of :class:`CompiledOrder` from its steps, one op at a time (the reference fold)."""
    # b1 >= 0 exactly when d1 sits on another rank (compile_order_reference, fast_compile)
    awaited = {d1 for _r, _key, d1, b1, _d2, _ci in steps if b1 >= 0}
    prev = [-1] * pp
    fold = [-1] * pp  # cost index of the op folded into the rank's next one (-1: none)
    fold_key = [-1] * pp
    chain = []
    for r, key, d1, b1, _d2, ci in steps:
        if b1 < 0 and key not in awaited:
            if fold[r] >= 0:  # a second such op in a row: the first becomes a step of its own
                chain.append((fold_key[r], prev[r], -1, -1, -1, fold[r]))
                prev[r] = fold_key[r]
            fold[r], fold_key[r] = ci, key
            continue
        chain.append((key, prev[r], fold[r], d1 if b1 >= 0 else -1, b1, ci))
        prev[r], fold[r] = key, -1
    return tuple(chain), tuple(zip(prev, fold))


def _key(cls: int, mb: int, v: int, m: int, n_stages: int) -> int:
    return (cls * m + mb) * n_stages + v


def _describe_key(key: int, m: int, n_stages: int, smap: Sequence[tuple[int, int]]) -> str:
    rest, v = divmod(key, n_stages)
    cls, mb = divmod(rest, m)
    r, c = smap[v]
    return f"{'FBW'[cls]}(mb={mb}, stage {v} = rank {r} chunk {c})"


def _check_sizes(n_ranks: int, pp: int, vpp: int, layout: Layout, m: int) -> None:
    if pp < 1 or vpp < 1 or m < 1:
        raise InvalidConfigError(f"pp={pp}, vpp={vpp}, num_microbatches={m} must all be >= 1")
    if layout not in LAYOUTS:
        raise InvalidConfigError(f"layout={layout!r} is not one of {' | '.join(LAYOUTS)}")
    if n_ranks != pp:
        raise InvalidConfigError(f"order has {n_ranks} rank lists, pp={pp} needs one per rank")


def compile_order(order: Sequence[Sequence[Op]], pp: int, vpp: int, layout: Layout,
                  num_microbatches: int) -> CompiledOrder:
    """Validate an order (every op exactly once, consistent B/W splitting) and precompute its tables.

    Runs the vectorised compiler (``fast_compile``) and, for an order it does not accept (malformed,
    deadlocking), the reference compiler, which raises with the details."""
    _check_sizes(len(order), pp, vpp, layout, num_microbatches)
    arrays = [ops_to_array(ops) for ops in order]
    if all(a is not None for a in arrays):
        fields = compile_arrays(arrays, pp, vpp, layout, num_microbatches)
        if fields is not None:
            return CompiledOrder(pp=pp, vpp=vpp, layout=layout, num_microbatches=num_microbatches, **fields)
    return compile_order_reference(order, pp, vpp, layout, num_microbatches)


def compile_order_arrays(arrays: Sequence[np.ndarray], pp: int, vpp: int, layout: Layout,
                         num_microbatches: int) -> CompiledOrder:
    """:func:`compile_order` for an order in array form (``fast_compile``: per rank, rows of kind
    code, mb, chunk), as the fixed-order schedules build them."""
    _check_sizes(len(arrays), pp, vpp, layout, num_microbatches)
    fields = compile_arrays(arrays, pp, vpp, layout, num_microbatches)
    if fields is not None:
        return CompiledOrder(pp=pp, vpp=vpp, layout=layout, num_microbatches=num_microbatches, **fields)
    order = [[Op(KIND_CODES[k] if 0 <= k < len(KIND_CODES) else f"kind {k}", mb, c)  # type: ignore[arg-type]
              for k, mb, c in np.asarray(a).reshape(-1, 3).tolist()] for a in arrays]
    return compile_order_reference(order, pp, vpp, layout, num_microbatches)


def compile_order_reference(order: Sequence[Sequence[Op]], pp: int, vpp: int, layout: Layout,
                            num_microbatches: int) -> CompiledOrder:
    """The per-op reference compiler (a list-scheduling walk); the source of every error message."""
    m = num_microbatches
    problems: list[str] = []
    _check_sizes(len(order), pp, vpp, layout, m)
    n_stages = pp * vpp
    smap = stage_map(layout, pp, vpp)
    vs = [[virtual_stage(layout, pp, vpp, r, c) for c in range(vpp)] for r in range(pp)]
    ops_all = []
    for r, ops in enumerate(order):
        for op in ops:
            if op.kind not in _KIND_INDEX or not 0 <= op.mb < m or not 0 <= op.chunk < vpp:
                problems.append(f"rank {r}: invalid op {op!r} (kinds F/B/W/BW, mb < {m}, chunk < {vpp})")
                continue
            ops_all.append((r, op.kind, op.mb, op.chunk))
    if problems:
        raise InvalidConfigError(problems[:10])
    # every cell (rank, mb, chunk) needs exactly one F, and either one BW or one B and one W
    # (set arithmetic instead of a per-cell scan: this runs for every new (schedule, pp, vpp, m))
    seen = Counter(ops_all)
    cells = {(r, mb, c) for r in range(pp) for c in range(vpp) for mb in range(m)}
    by_kind = {k: set() for k in _KIND_INDEX}
    for (r, k, mb, c), n in seen.items():
        by_kind[k].add((r, mb, c))
        if n > 1:
            problems.append(f"rank {r}: {k}(mb={mb}, chunk={c}) appears {n} times, needs exactly 1")
    for r, mb, c in sorted(cells - by_kind["F"]):
        problems.append(f"rank {r}: F(mb={mb}, chunk={c}) appears 0 times, needs exactly 1")
    fused, split_b, split_w = by_kind["BW"], by_kind["B"], by_kind["W"]
    bad = (fused & (split_b | split_w)) | (split_b ^ split_w) | (cells - fused - split_b)
    for r, mb, c in sorted(bad):
        problems.append(f"rank {r}: backward of (mb={mb}, chunk={c}) needs one BW or one B and one W, got "
                        f"BW x{seen.get((r, 'BW', mb, c), 0)}, B x{seen.get((r, 'B', mb, c), 0)}, "
                        f"W x{seen.get((r, 'W', mb, c), 0)}")
    n_split = len(split_b & split_w)
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise InvalidConfigError(problems[:9] + [problems[9] + more] if len(problems) > 10 else problems)

    rank_ops = []
    op_counts = []
    rows_rank: list[int] = []
    rows_alive: list[list[int]] = []
    rows_b: list[list[int]] = []
    rows_w: list[list[int]] = []
    segments: list[int] = []
    peak_in_flight = []
    for r, ops in enumerate(order):
        table = []
        counts = [0] * (4 * vpp)
        alive = [0] * vpp
        nb = [0] * vpp
        nw = [0] * vpp
        live_chunks = 0
        peak = 0
        segments.append(len(rows_rank))
        for op in ops:
            c, mb = op.chunk, op.mb
            v = vs[r][c]
            kind = op.kind
            ci = _KIND_INDEX[kind] * vpp + c
            counts[ci] += 1
            own = _key(_DEP_CLASS[kind], mb, v, m, n_stages)
            if kind == "F":
                if v > 0:
                    prev_rank = smap[v - 1][0]
                    table.append((own, _key(0, mb, v - 1, m, n_stages), v - 1 if prev_rank != r else -1, -1, ci))
                else:
                    table.append((own, -1, -1, -1, ci))
                alive[c] += 1
                live_chunks += 1
                peak = max(peak, live_chunks)
                rows_rank.append(r)
                rows_alive.append(alive.copy())
                rows_b.append(nb.copy())
                rows_w.append(nw.copy())
            elif kind == "W":
                table.append((own, _key(1, mb, v, m, n_stages), -1, -1, ci))
                nw[c] += 1
                live_chunks -= 1
            else:  # B or BW
                f_key = _key(0, mb, v, m, n_stages)
                if v < n_stages - 1:
                    next_rank = smap[v + 1][0]
                    table.append((own, _key(1, mb, v + 1, m, n_stages), v if next_rank != r else -1, f_key, ci))
                else:
                    table.append((own, f_key, -1, -1, ci))
                if kind == "B":
                    nb[c] += 1
                else:
                    alive[c] -= 1
                    live_chunks -= 1
        rank_ops.append(tuple(table))
        op_counts.append(tuple(counts))
        peak_in_flight.append(peak)
    offsets = [0]
    for table in rank_ops:
        offsets.append(offsets[-1] + len(table))
    n_keys = 3 * m * n_stages
    steps, slots = _evaluation_order(rank_ops, offsets, n_keys, vpp, order, layout, pp, m)
    return CompiledOrder(
        pp=pp, vpp=vpp, layout=layout, num_microbatches=m,
        order=tuple(tuple(ops) for ops in order), steps=steps, step_slots=np.asarray(slots, dtype=np.intp),
        rank_offsets=tuple(offsets), n_keys=n_keys, op_counts=tuple(op_counts),
        mem_row_rank=np.asarray(rows_rank, dtype=np.intp),
        mem_alive=np.asarray(rows_alive, dtype=float).reshape(-1, vpp),
        mem_b=np.asarray(rows_b, dtype=float).reshape(-1, vpp),
        mem_w=np.asarray(rows_w, dtype=float).reshape(-1, vpp),
        mem_segments=np.asarray(segments, dtype=np.intp), peak_in_flight=tuple(peak_in_flight),
        splits_bw=n_split > 0)


def _evaluation_order(rank_ops: list[tuple[tuple[int, int, int, int, int], ...]], offsets: list[int], n_keys: int,
                      vpp: int, order: Sequence[Sequence[Op]], layout: Layout, pp: int, m: int
                      ) -> tuple[tuple[tuple[int, int, int, int, int, int], ...], list[int]]:
    """List-scheduling walk without times: a rank runs until its next op misses a dependency, parks
    on it, and is woken when it completes. Ops are emitted in a valid evaluation order; ranks left
    parked mean the order deadlocks (ScheduleDeadlockError names them)."""
    done = [False] * n_keys
    waiting: dict[int, list[int]] = {}
    ptr = [0] * pp
    steps = []
    slots = []
    stack = list(range(pp - 1, -1, -1))
    while stack:
        r = stack.pop()
        ops = rank_ops[r]
        i = ptr[r]
        base = offsets[r]
        while i < len(ops):
            key, d1, b1, d2, ci = ops[i]
            missing = d1 if d1 >= 0 and not done[d1] else d2 if d2 >= 0 and not done[d2] else -1
            if missing >= 0:
                waiting.setdefault(missing, []).append(r)
                break
            steps.append((r, key, d1, b1, d2, r * 4 * vpp + ci))
            slots.append(base + i)
            done[key] = True
            woken = waiting.pop(key, None)
            if woken:
                stack.extend(woken)
            i += 1
        ptr[r] = i
    if len(steps) < offsets[-1]:
        n_stages = pp * vpp
        smap = stage_map(layout, pp, vpp)
        lines = []
        for r, ops in enumerate(rank_ops):
            if ptr[r] >= len(ops):
                continue
            _, d1, _, d2, _ = ops[ptr[r]]
            missing = [d for d in (d1, d2) if d >= 0 and not done[d]]
            lines.append(f"rank {r} stuck at op #{ptr[r]} {order[r][ptr[r]]} waiting for "
                         + ", ".join(_describe_key(d, m, n_stages, smap) for d in missing))
        raise ScheduleDeadlockError("pipeline order deadlocks (no rank can make progress): " + "; ".join(lines))
    return tuple(steps), slots


def _check_costs(plan: CompiledOrder, costs: StageCosts) -> None:
    if costs.pp != plan.pp or costs.vpp != plan.vpp:
        raise InvalidConfigError(f"costs are for pp={costs.pp}, vpp={costs.vpp} but the order has "
                                 f"pp={plan.pp}, vpp={plan.vpp}")


def _cost_vectors(plan: CompiledOrder, costs: StageCosts) -> tuple[list[list[float]], list[float], list[float]]:
    """Per rank, its cost of each (kind, chunk) cost index; the flat cost table the replay indexes (sends a
    blocking runtime holds the rank for added, 0.0 at index -1: nothing folded) and the boundary latencies
    (0.0 at index -1: same rank / no dependency)."""
    _check_costs(plan, costs)
    pp, vpp = plan.pp, plan.vpp
    cost_vecs = [list(costs.f_s[r]) + list(costs.b_s[r]) + list(costs.w_s[r])
                 + [b + w for b, w in zip(costs.b_s[r], costs.w_s[r])] for r in range(pp)]
    if costs.p2p_blocking:
        # a send holds the sender for the transfer; the consumer sees the data at the sender's end
        send = costs.send_s(plan.layout)
        held = [[send[r][c][0] for c in range(vpp)] + [send[r][c][1] for c in range(vpp)] + [0.0] * vpp
                + [send[r][c][1] for c in range(vpp)] for r in range(pp)]
        cost = [x + h for vec, hv in zip(cost_vecs, held) for x, h in zip(vec, hv)]
        lat = [0.0] * (pp * vpp)
    else:
        cost = [x for vec in cost_vecs for x in vec]
        lat = list(costs.boundary_p2p_s())
        lat.append(0.0)  # boundary -1: same rank / no dependency
    cost.append(0.0)  # cost index -1: nothing folded
    return cost_vecs, cost, lat


def _replay_chain(plan: CompiledOrder, cost: list[float], lat: list[float]) -> list[float]:
    """Finish time of every key the folded chain emits (the timed pass without a timeline)."""
    fin = [0.0] * (plan.n_keys + 1)  # key -1: no dependency, "finished" at 0
    for key, prev, fold, d, b, ci in plan.chain:  # start: rank predecessor (+ a folded op), cross input + p2p
        s = fin[prev] + cost[fold]
        f = fin[d] + lat[b]
        fin[key] = (f if f > s else s) + cost[ci]
    return fin


def _chain_span(plan: CompiledOrder, cost: list[float], lat: list[float]) -> float:
    """The makespan of the chain's replay (a rank without ops: 0): compiled where the process runs the C extension
    or has replayed enough to pay for loading numba (``_jit``), else :func:`_replay_chain`; bit-identical."""
    replay = _jit.compiled(len(plan.chain))
    if replay is not None:
        handle = _prepared(plan, replay)
        if handle is not None:
            return replay.span(handle, cost, lat)
    return _makespan(plan, _replay_chain(plan, cost, lat), cost)


class _Prepared:
    """A plan's chain prepared for one compiled replay, held by the plan (so it lives as long as the plan). Not
    pickled: a copy arrives empty and prepares again on first use (the C extension's handle is a capsule)."""

    __slots__ = ("replay", "handle")

    def __init__(self, replay: Any = None, handle: Any = None) -> None:
        self.replay, self.handle = replay, handle

    def __reduce__(self) -> tuple:
        return _Prepared, ()


def _prepared(plan: CompiledOrder, replay: _jit.Replay) -> Any:
    """``replay.prepare`` of the plan's chain, once per plan and replay (the C extension checks it once)."""
    p = plan.prepared
    if p is not None and p.replay is replay:
        return p.handle
    handle = replay.prepare(*_chain_arrays(plan), plan.n_keys)
    object.__setattr__(plan, "prepared", _Prepared(replay, handle))
    return handle


def _makespan(plan: CompiledOrder, fin: list[float], cost: list[float]) -> float:
    """The latest rank end from a replay's finish times (a rank without ops: 0)."""
    return max(fin[k] + cost[fold] for k, fold in plan.tails)


def _chain_arrays(plan: CompiledOrder) -> tuple[np.ndarray, np.ndarray]:
    """``plan.chain_arrays``: the vectorised compiler's, else made from the chain and tails once per plan."""
    arrays = plan.chain_arrays
    if arrays is None:
        arrays = (np.asarray(plan.chain, dtype=np.int64).reshape(-1, 6),
                  np.asarray(plan.tails, dtype=np.int64).reshape(-1, 2))
        object.__setattr__(plan, "chain_arrays", arrays)
    return arrays


def _result(plan: CompiledOrder, costs: StageCosts, cost_vecs: list[list[float]], makespan: float, *, name: str,
            approximate: bool, note: str, times: dict[str, tuple[tuple[float, ...], ...]] | None) -> PipelineResult:
    """The PipelineResult of a replay: busy times from the op counts, memory peaks from the order's tables."""
    pp = plan.pp
    busy = tuple(sum(n * x for n, x in zip(plan.op_counts[r], cost_vecs[r])) for r in range(pp))
    act = np.asarray(costs.act_bytes, dtype=float)
    live, rows_rank, segments = _live(plan, costs.b_release_fraction)
    if not (act >= 0).all():  # the frontier below assumes non-negative activation sizes: every sample then
        live, rows_rank, segments = _live_all(plan, costs.b_release_fraction)
    per_sample = (live * act[rows_rank]).sum(axis=1)
    peaks = np.maximum.reduceat(per_sample, segments)
    return PipelineResult(
        schedule=name, pp=pp, vpp=plan.vpp, layout=plan.layout, num_microbatches=plan.num_microbatches,
        makespan_s=makespan, busy_s=busy, bubble_s=tuple(makespan - b for b in busy),
        peak_activation_bytes=tuple(peaks.tolist()), peak_in_flight=plan.peak_in_flight,
        order=plan.order, **(times if times is not None else {"start_s": ((),) * pp, "end_s": ((),) * pp}),
        approximate=approximate, note=note)


_LIVE: dict[tuple[int, float, bool], tuple[CompiledOrder, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}


def _live_all(plan: CompiledOrder, frac: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per memory sample and chunk, the micro-batches still holding activations when B frees ``frac`` of them
    and W the rest; each sample's rank; the first sample of each rank): every sample (order-only: cached per
    compiled order and fraction)."""
    return _cached_live(plan, frac, False)


def _live(plan: CompiledOrder, frac: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_live_all` restricted to each rank's frontier: the samples no other sample of the rank holds at least
    as many micro-batches of every chunk as (one of equal ones). With non-negative activation sizes a dropped
    sample's bytes never exceed a kept one's (products and a sum in the same order are monotone in each term),
    so the rank's peak is the same number, from a few rows where a long run has tens of thousands."""
    return _cached_live(plan, frac, True)


def _cached_live(plan: CompiledOrder, frac: float, frontier: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = (id(plan), frac, frontier)
    hit = _LIVE.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    live = plan.mem_alive - frac * plan.mem_b - (1.0 - frac) * plan.mem_w
    out = _frontier(live, plan.mem_row_rank, plan.mem_segments) if frontier else \
        (live, plan.mem_row_rank, plan.mem_segments)
    if len(_LIVE) > 1024:
        _LIVE.clear()
    _LIVE[key] = (plan, out)
    return out


def _frontier(live: np.ndarray, rows_rank: np.ndarray, segments: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each segment's (rank's) non-dominated rows of ``live`` (see :func:`_live`), the rows' ranks and the new
    segment starts."""
    bounds = [int(x) for x in segments] + [live.shape[0]]
    if any(b <= a for a, b in zip(bounds[:-1], bounds[1:])):  # a rank without samples: keep them all
        return live, rows_rank, segments
    ext = _jit.kernels()
    if ext is not None:  # the C extension: each segment's exact frontier, in row order (the same peaks)
        keep, starts64 = np.zeros(live.shape[0], dtype=np.uint8), np.asarray(segments, dtype=np.int64)
        ext.frontier(np.ascontiguousarray(live, dtype=np.float64), live.shape[1], starts64, keep)
        kept = keep.view(bool)
        counts = np.add.reduceat(keep, starts64, dtype=np.int64)
        starts = np.zeros(len(counts), dtype=segments.dtype)
        np.cumsum(counts[:-1], out=starts[1:])
        return np.ascontiguousarray(live[kept]), rows_rank[kept], starts
    parts, ranks, starts, at = [], [], [], 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        parts.append(kept := _non_dominated(live[a:b]))
        ranks.append(np.full(len(kept), rows_rank[a], dtype=rows_rank.dtype))
        starts.append(at)
        at += len(kept)
    return (np.ascontiguousarray(np.concatenate(parts)), np.concatenate(ranks),
            np.asarray(starts, dtype=segments.dtype))


_PAIRWISE_ROWS = 256
"""Most distinct rows :func:`_non_dominated` compares pairwise at once (a 256 x 256 boolean table per column);
more go through its loop, one kept row at a time."""


def _non_dominated(rows: np.ndarray) -> np.ndarray:
    """The rows no other row is >= in every column (one of equal rows), and in 3 or more columns past
    ``_PAIRWISE_ROWS`` distinct rows perhaps a few more: a superset of the frontier, so the largest bytes of the
    rows kept are those of all the rows."""
    if rows.shape[1] == 1:
        return rows[[int(np.argmax(rows[:, 0]))]]
    if rows.shape[1] == 2:  # by the first column descending (ties: the second): kept where the second exceeds all before
        order = np.lexsort((-rows[:, 1], -rows[:, 0]))
        r = rows[order]
        before = np.maximum.accumulate(r[:, 1])
        keep = np.empty(len(r), dtype=bool)
        keep[0] = True
        keep[1:] = r[1:, 1] > before[:-1]
        return r[keep]
    # equal rows once (sorted, each unlike the one before), then every pair at once while that is small: a row
    # another (distinct) row is >= in every column is dominated, and the rest is exactly the frontier
    r = rows[np.lexsort(rows.T[::-1])]
    distinct = np.empty(len(r), dtype=bool)
    distinct[0] = True
    distinct[1:] = (r[1:] != r[:-1]).any(axis=1)
    rows = r[distinct]
    if len(rows) <= _PAIRWISE_ROWS:
        cols = rows.T
        covered = cols[0][np.newaxis, :] >= cols[0][:, np.newaxis]  # [i, j]: row j >= row i in every column
        for c in cols[1:]:
            covered &= c[np.newaxis, :] >= c[:, np.newaxis]
        np.fill_diagonal(covered, False)
        return rows[~covered.any(axis=1)]
    rows = rows[np.argsort(-rows.sum(axis=1), kind="stable")]
    kept = []
    while len(rows):  # keep the largest sum left, drop every row it dominates (itself and equal rows too); a kept
        kept.append(rows[0])  # row another dominates with an equal rounded sum is extra, never wrong
        rows = rows[~(rows <= rows[0]).all(axis=1)]
    return np.stack(kept)


def run_compiled(plan: CompiledOrder, costs: StageCosts, *, name: str = "custom", approximate: bool = False,
                 note: str = "", timeline: bool = True) -> PipelineResult:
    """Simulate a compiled order with ``costs`` (the hot path of the oracle's search loop). ``timeline=False``
    leaves the per-op start/end times out of the result (empty per rank): the projector reads only the
    makespan, busy times and memory peaks, and the replay is quicker without them."""
    cost_vecs, cost, lat = _cost_vectors(plan, costs)
    if not timeline:
        return _result(plan, costs, cost_vecs, _chain_span(plan, cost, lat), name=name, approximate=approximate,
                       note=note, times=None)
    fin = _replay_all(plan, cost, lat)
    return _result(plan, costs, cost_vecs, _makespan(plan, fin, cost), name=name, approximate=approximate, note=note,
                   times=_timeline(plan, fin, lat))


BATCH_REPLAY_MIN = 8
"""Fewest configurations of one compiled order that :func:`run_compiled_many` replays together with numpy
(level by level, every configuration at once); fewer go through the scalar chain one by one."""
BATCH_REPLAY_WORK = 64
"""... and configurations x ranks at least this: a level holds about one step per rank, and one numpy level
(~15 us for a few configurations) costs as much as ~80 scalar steps, so narrow pipelines need more
configurations before the batch pays (pp=2: 32, pp=8: 8)."""


def run_compiled_many(plan: CompiledOrder, costs_list: Sequence[StageCosts], *, name: str = "custom",
                      approximate: bool = False, note: str = "") -> list[PipelineResult]:
    """:func:`run_compiled` (``timeline=False``) of many cost sets on one compiled order, with exactly the
    same results: a batch replays the folded chain level by level with numpy, each level's steps for every
    configuration at once, with the same float additions and comparisons as the scalar pass (a max of two
    sums, plus a cost), so every finish time is bit-identical."""
    prepared = [_cost_vectors(plan, c) for c in costs_list]
    if (len(prepared) >= BATCH_REPLAY_MIN and len(prepared) * plan.pp >= BATCH_REPLAY_WORK
            and _jit.compiled(len(plan.chain) * len(prepared)) is None):  # compiled: one by one is quicker
        spans = _replay_levels(plan, [p[1] for p in prepared], [p[2] for p in prepared])
    else:
        spans = [_chain_span(plan, p[1], p[2]) for p in prepared]
    return [_result(plan, c, p[0], float(span), name=name, approximate=approximate, note=note, times=None)
            for c, p, span in zip(costs_list, prepared, spans)]


_LEVELS: dict[int, tuple[CompiledOrder, list[tuple[np.ndarray, ...]], np.ndarray]] = {}


def _chain_levels(plan: CompiledOrder) -> tuple[list[tuple[np.ndarray, ...]], np.ndarray]:
    """The folded chain grouped into levels (a step's level is one more than its inputs'), as index arrays
    (key, prev, fold, dep, boundary, cost index) per level, and the tails as (key, fold) arrays; cached per
    compiled order."""
    hit = _LEVELS.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1], hit[2]
    level = [0] * (plan.n_keys + 1)  # key -1 (the sentinel) at level 0; steps from level 1
    step_level = []
    for key, prev, _fold, d, _b, _ci in plan.chain:
        lv = level[prev] if level[prev] > level[d] else level[d]
        level[key] = lv + 1
        step_level.append(lv + 1)
    chain, tails = _chain_arrays(plan)
    order = np.argsort(np.asarray(step_level, dtype=np.intp), kind="stable")
    bounds = np.flatnonzero(np.diff(np.asarray(step_level, dtype=np.intp)[order])) + 1
    levels = [tuple(np.ascontiguousarray(part[:, j]) for j in range(6)) for part in np.split(chain[order], bounds)]
    if len(_LEVELS) > 256:
        _LEVELS.clear()
    _LEVELS[id(plan)] = (plan, levels, tails)
    return levels, tails


def _replay_levels(plan: CompiledOrder, costs: list[list[float]], lats: list[list[float]]) -> np.ndarray:
    """Makespan of each configuration (``costs[i]``, ``lats[i]`` as :func:`_cost_vectors` gives them): the
    chain's recurrence fin[key] = max(fin[prev] + cost[fold], fin[dep] + lat[b]) + cost[ci], one level at a
    time over all configurations (rows of ``fin`` are keys, columns configurations; index -1 is the 0.0
    sentinel row of each table, as in the scalar pass)."""
    levels, tails = _chain_levels(plan)
    cost = np.asarray(costs, dtype=float).T.copy()  # (cost index, configuration)
    lat = np.asarray(lats, dtype=float).T.copy()
    fin = np.zeros((plan.n_keys + 1, cost.shape[1]))
    for key, prev, fold, d, b, ci in levels:
        s = fin[prev] + cost[fold]
        f = fin[d] + lat[b]
        fin[key] = np.maximum(s, f) + cost[ci]
    return (fin[tails[:, 0]] + cost[tails[:, 1]]).max(axis=0)


def _replay_all(plan: CompiledOrder, cost: list[float], lat: list[float]) -> list[float]:
    """Every op's finish time (the timeline needs the folded ones too): the unfolded steps."""
    fin = [0.0] * (plan.n_keys + 1)
    free = [0.0] * plan.pp
    for r, key, d1, b1, d2, ci in plan.steps:
        s = free[r]
        f = fin[d1] + lat[b1]
        if f > s:
            s = f
        f = fin[d2]
        if f > s:
            s = f
        fin[key] = free[r] = s + cost[ci]
    return fin


def _timeline(plan: CompiledOrder, fin: list[float], lat: list[float]) -> dict[str, tuple[tuple[float, ...], ...]]:
    """Per-rank start and end times of every op, read back from the replay's finish times: an op ends at its
    key's finish time and started at the latest of its rank's previous end and its inputs' arrivals (the
    same floats the replay compared, so the same values)."""
    n_ops = plan.rank_offsets[-1]
    starts, ends = [0.0] * n_ops, [0.0] * n_ops
    prev_end = [0.0] * plan.pp
    for (r, key, d1, b1, d2, _ci), slot in zip(plan.steps, plan.step_slots.tolist()):
        starts[slot] = max(prev_end[r], fin[d1] + lat[b1], fin[d2])
        ends[slot] = prev_end[r] = fin[key]
    offs = plan.rank_offsets
    return {"start_s": tuple(tuple(starts[offs[r]:offs[r + 1]]) for r in range(plan.pp)),
            "end_s": tuple(tuple(ends[offs[r]:offs[r + 1]]) for r in range(plan.pp))}


def simulate(order: Sequence[Sequence[Op]], pp: int, vpp: int, layout: Layout, num_microbatches: int,
             costs: StageCosts, *, name: str = "custom", approximate: bool = False, note: str = "") -> PipelineResult:
    """Simulate per-rank op lists ``order`` (see the module docstring for the exact semantics).

    Raises InvalidConfigError for a malformed order (missing/duplicate ops, wrong shapes) and
    ScheduleDeadlockError (a ValueError) when the order can never finish.
    """
    return run_compiled(compile_order(order, pp, vpp, layout, num_microbatches), costs,
                        name=name, approximate=approximate, note=note)


def lower_bound_s(pp: int, vpp: int, layout: Layout, num_microbatches: int, costs: StageCosts) -> float:
    """A makespan no order can beat: max(busiest rank + its earliest start, one micro-batch's chain).

    The chain is F through every stage (+ p2p), then B back to stage v and that stage's W, maximised
    over v; the B and W costs used are those of split schedules (a fused BW costs the same b + w).
    """
    smap = stage_map(layout, pp, vpp)
    n_stages = pp * vpp
    lat = list(costs.boundary_p2p_s())
    for v in range(n_stages - 1):
        if smap[v][0] == smap[v + 1][0]:
            lat[v] = 0.0
    f = [costs.f_s[r][c] for r, c in smap]
    b = [costs.b_s[r][c] for r, c in smap]
    w = [costs.w_s[r][c] for r, c in smap]
    f_start = [0.0] * n_stages
    for v in range(1, n_stages):
        f_start[v] = f_start[v - 1] + f[v - 1] + lat[v - 1]
    t = f_start[-1] + f[-1]
    chain = 0.0
    for v in range(n_stages - 1, -1, -1):
        t += b[v]
        chain = max(chain, t + w[v])
        if v > 0:
            t += lat[v - 1]
    m = num_microbatches
    per_rank = 0.0
    for r in range(pp):
        busy = m * sum(costs.f_s[r][c] + costs.b_s[r][c] + costs.w_s[r][c] for c in range(vpp))
        head = min(f_start[virtual_stage(layout, pp, vpp, r, c)] for c in range(vpp))
        per_rank = max(per_rank, head + busy)
    return max(chain, per_rank)
