"""Vectorised compilation of a pipeline order (numpy), the fast path of ``simulator.compile_order``.

An order in array form is one ``(n_ops, 3)`` integer array per rank, rows ``(kind, mb, chunk)`` with
kind codes ``F=0, B=1, W=2, BW=3`` (:data:`KIND_CODES`). :func:`compile_arrays` builds the same tables
as the reference compiler (``simulator.compile_order_reference``) without a Python loop per op:

- validation: one ``bincount`` of (kind, rank, chunk, micro-batch) cells;
- dependencies: array arithmetic on the keys of the module docstring of ``simulator``;
- evaluation order: longest-path levels ("ticks") of the dependency graph with unit op lengths,
  relaxed to their fixed point (per rank: a gather of the dependencies' ticks and a running
  maximum, ranks swept down and up). Ticks grow strictly along every edge (dependency and rank
  predecessor), so sorting the ops by tick is a topological order, which is all the timed pass
  needs: each op's start is the same ``max`` over the same finish times in any such order, so the
  times are bit-identical. A tick reaching the op count proves a cycle (a deadlocking order); the
  caller then runs the reference compiler, which names the stuck ranks;
- memory samples and in-flight peaks: per-rank cumulative sums sampled at the forwards.

:func:`compile_arrays` returns None for anything it does not accept (malformed or deadlocking
orders, or slow convergence), and the caller falls back to the reference compiler, whose error
messages stay the only ones.

Where the C extension runs (``_jit.kernels``: built at install, ``RAYTUNE_PRIMUS_JIT`` auto or on), the same
tables come from its loops instead, op by op (``compile_core``: validation, dependencies, memory samples;
``tick_order``: the same levels, each rank advanced while its next op's inputs are placed, and a counting sort;
``fold_chain``: the folded chain), byte for byte what the numpy passes give
(tests/oracle/test_pipeline_fast_compile.py).
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from contextlib import contextmanager
from operator import itemgetter

import numpy as np

from oracle.pipeline import _jit
from oracle.pipeline.types import Layout, Op, stage_map, virtual_stage

KIND_CODES: tuple[str, ...] = ("F", "B", "W", "BW")
_KIND_CODE = {k: i for i, k in enumerate(KIND_CODES)}
_DEP_CLASS = np.array([0, 1, 2, 1], dtype=np.int64)  # BW completes the "B" of its stage for its consumers
_COUNT_ROW = np.array([0, 1, 2, 0], dtype=np.int64)
"""Memory-table count each kind moves (F, BW: alive; B: released by B; W: released by W)..."""
_COUNT_STEP = np.array([1, 1, 1, -1], dtype=np.int32)
"""... and by how much (BW frees a micro-batch F made alive)."""
_LIVE_STEP = np.array([1, 0, -1, -1], dtype=np.int32)
"""Change in the chunks alive on the rank (F adds one; W or BW frees it)."""
_MAX_ROUNDS = 64
"""Relaxation sweeps before giving up on the fast path (pipeline orders settle in one to three)."""
_OP_TABLES: dict[int, list[Op]] = {}
"""Interned Op objects per vpp, indexed by ``(mb * 4 + kind) * vpp + chunk`` (Ops are immutable)."""


def ops_to_array(ops: Sequence[Op]) -> np.ndarray | None:
    """One rank's op list as a ``(n, 3)`` array of (kind code, mb, chunk); None for an unknown kind."""
    try:
        arr = np.array([(_KIND_CODE[op.kind], op.mb, op.chunk) for op in ops])
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    if arr.size and arr.dtype.kind not in "iu":
        return None  # a non-integer mb or chunk: the reference compiler reports it
    return arr.astype(np.int64).reshape(-1, 3)


def array_to_ops(arr: np.ndarray, vpp: int) -> tuple[Op, ...]:
    """The Op tuple of one rank's array (interned Ops: one object per (kind, mb, chunk))."""
    if not len(arr):
        return ()
    codes = (arr[:, 1] * 4 + arr[:, 0]) * vpp + arr[:, 2]
    table = _OP_TABLES.setdefault(vpp, [])
    top = int(codes.max())
    if top >= len(table):
        start_mb = len(table) // (4 * vpp)
        end_mb = top // (4 * vpp) + 1
        table.extend(Op(KIND_CODES[k], mb, c) for mb in range(start_mb, end_mb) for k in range(4)
                     for c in range(vpp))
    return tuple(table[i] for i in codes.tolist()) if len(codes) == 1 else itemgetter(*codes.tolist())(table)


def compile_arrays(arrays: Sequence[np.ndarray], pp: int, vpp: int, layout: Layout, m: int) -> dict | None:
    """The CompiledOrder fields of an order in array form, or None (caller uses the reference path).

    ``pp, vpp, layout, m`` are assumed checked by the caller (sizes >= 1, a known layout, one array
    per rank)."""
    lens = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=pp)
    n = int(lens.sum())
    if n == 0:
        return None
    offsets = np.zeros(pp + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    ops = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1, 3) for a in arrays])
    ext = _jit.kernels()
    if ext is not None:
        return _compile_native(ext, ops, offsets, pp, vpp, layout, m)
    return _compile_numpy(ops, offsets, pp, vpp, layout, m)


def _compile_numpy(ops: np.ndarray, offsets: np.ndarray, pp: int, vpp: int, layout: Layout, m: int) -> dict | None:
    """:func:`compile_arrays` in numpy passes (``ops``: every rank's rows, one after another, as ``offsets`` say)."""
    n, lens = len(ops), np.diff(offsets)
    kind, mb, chunk = ops[:, 0].copy(), ops[:, 1].copy(), ops[:, 2].copy()
    if (kind.min() < 0 or kind.max() > 3 or mb.min() < 0 or mb.max() >= m or chunk.min() < 0
            or chunk.max() >= vpp):
        return None
    rank = np.repeat(np.arange(pp, dtype=np.int64), lens)
    # every cell (rank, chunk, mb) needs exactly one F, and either one BW or one B and one W
    n_cells = pp * vpp * m
    cell = (rank * vpp + chunk) * m + mb
    cnt = np.bincount(kind * n_cells + cell, minlength=4 * n_cells).reshape(4, n_cells)
    fused = (cnt[3] == 1) & (cnt[1] == 0) & (cnt[2] == 0)
    split = (cnt[3] == 0) & (cnt[1] == 1) & (cnt[2] == 1)
    if not (cnt[0] == 1).all() or not (fused | split).all():
        return None

    n_stages = pp * vpp
    rank_of_stage, vs = _stage_maps(layout, pp, vpp)
    v = vs[rank, chunk]
    own = (_DEP_CLASS[kind] * m + mb) * n_stages + v
    # each op's dependencies from whole-array candidates chosen by kind (no masked gathers: ~4x quicker)
    f_key = mb * n_stages + v  # F(mb, v)
    b_key = f_key + m * n_stages  # B(mb, v)
    is_f = kind == 0
    is_w = kind == 2
    b_mid = ~(is_f | is_w) & (v < n_stages - 1)  # a B or BW before the last stage (kinds are 0-3, checked above)
    # F(mb, v) needs F(mb, v-1); W(mb, v) needs B(mb, v); B(mb, v) needs B(mb, v+1) and F(mb, v), the last
    # stage's B only its F
    d1 = np.where(is_f, np.where(v > 0, f_key - 1, -1), np.where(is_w | b_mid, b_key + b_mid, f_key))
    # a dependency on another rank: the boundary it crosses (v-1 -> v forward, v -> v+1 backward)
    cross_f = is_f & (v > 0) & (rank_of_stage[np.maximum(v - 1, 0)] != rank)
    cross_b = b_mid & (rank_of_stage[np.minimum(v + 1, n_stages - 1)] != rank)
    b1 = np.where(cross_f, v - 1, np.where(cross_b, v, -1))
    d2 = np.where(b_mid, f_key, -1)

    perm = _tick_order(own, d1, d2, offsets, n, 3 * m * n_stages)
    if perm is None:
        return None
    gci = rank * (4 * vpp) + kind * vpp + chunk

    # memory samples after every F: per-chunk counts of F - BW (alive), B and W so far on the rank, and
    # the chunks alive (F - BW - W); one running sum over all ranks, minus its value at the rank's start
    # (a row per count, so each running sum runs along contiguous memory; counts are exact in int32)
    delta = np.zeros((3 * vpp + 1, n + 1), dtype=np.int32)
    at = np.arange(1, n + 1)
    flat_delta = delta.reshape(-1)
    # each op moves its own count (F, BW: alive; B; W) and the live chunks (F +1; W, BW -1)
    flat_delta[(_COUNT_ROW[kind] * vpp + chunk) * (n + 1) + at] = _COUNT_STEP[kind]
    flat_delta[3 * vpp * (n + 1) + at] = _LIVE_STEP[kind]
    np.cumsum(delta, axis=1, dtype=np.int32, out=delta)
    f_rows = np.flatnonzero(is_f)
    sampled = (delta[:, f_rows + 1] - delta[:, offsets[rank[f_rows]]]).astype(np.float64)
    live = sampled[3 * vpp]
    n_f = np.bincount(rank[f_rows], minlength=pp)
    segments = np.zeros(pp, dtype=np.intp)
    np.cumsum(n_f[:-1], out=segments[1:])
    with _collector_paused():
        chain, tails = fold_columns(rank, own, d1, b1, gci, perm, offsets, 3 * m * n_stages)
    return _plan_fields(
        ops, offsets, vpp, m, (rank, own, d1, b1, d2, gci), perm, chain, tails,
        mem=(np.ascontiguousarray(sampled[:vpp].T), np.ascontiguousarray(sampled[vpp:2 * vpp].T),
             np.ascontiguousarray(sampled[2 * vpp:3 * vpp].T), rank[f_rows].astype(np.intp), segments),
        peak_in_flight=tuple(int(x) for x in np.maximum.reduceat(live, segments).tolist()),
        op_counts=np.bincount(gci, minlength=pp * 4 * vpp), splits_bw=bool(cnt[1].any()))


_KINDS = np.stack([_DEP_CLASS, _COUNT_ROW, _COUNT_STEP.astype(np.int64), _LIVE_STEP.astype(np.int64)])
"""The per-kind tables above as one ``(4, 4)`` int64 array (rows: dependency class, count row, count step, live
step), what the C extension's ``compile_core`` reads: the constants live here only."""


def _stage_maps(layout: Layout, pp: int, vpp: int) -> tuple[np.ndarray, np.ndarray]:
    """(the rank of each virtual stage, ``(pp, vpp)``: the virtual stage of each rank's chunk) as int64 arrays."""
    rank_of_stage = np.array([r for r, _ in stage_map(layout, pp, vpp)], dtype=np.int64)
    vs = np.array([[virtual_stage(layout, pp, vpp, r, c) for c in range(vpp)] for r in range(pp)], dtype=np.int64)
    return rank_of_stage, vs


def _native_tables(ext: Any, ops: np.ndarray, offsets: np.ndarray, pp: int, vpp: int, layout: Layout, m: int
                   ) -> tuple[int, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The C extension's ``compile_core`` of an order: (-1 for an order it does not accept, else 1 if any op is a
    split B and 0 if not; the per-op columns rank, key, d1, b1, d2, cost index; the tables mem_alive, mem_b,
    mem_w, the forwards' ranks, the op counts and the per-rank peaks)."""
    n, n_cells = len(ops), pp * vpp * m
    rank_of_stage, vs = _stage_maps(layout, pp, vpp)
    cols = tuple(np.empty(n, dtype=np.int64) for _ in range(6))
    tables = (np.empty((n_cells, vpp)), np.empty((n_cells, vpp)), np.empty((n_cells, vpp)),
              np.empty(n_cells, dtype=np.int64), np.empty(pp * 4 * vpp, dtype=np.int64), np.empty(pp, dtype=np.int64))
    split = ext.compile_core(ops, offsets, m, vpp, rank_of_stage, vs.reshape(-1), _KINDS, *cols, *tables)
    return split, cols, tables


def _compile_native(ext: Any, ops: np.ndarray, offsets: np.ndarray, pp: int, vpp: int, layout: Layout, m: int
                    ) -> dict | None:
    """:func:`compile_arrays` with the C extension: ``compile_core`` (the per-op tables and memory samples, the
    same values as the numpy passes), ``tick_order`` (:func:`_tick_order`'s permutation) and ``fold_chain``
    (:func:`fold_columns`' chain and tails)."""
    n, n_keys = len(ops), 3 * m * pp * vpp
    split, cols, (mem_alive, mem_b, mem_w, f_rank, op_counts, peak) = _native_tables(ext, ops, offsets, pp, vpp,
                                                                                    layout, m)
    if split < 0:
        return None
    rank, own, d1, b1, d2, gci = cols
    perm = np.empty(n, dtype=np.int64)
    if not ext.tick_order(own, d1, d2, offsets, n_keys, perm):
        return None
    chain = np.empty((n, 6), dtype=np.int64)
    tails = np.empty((pp, 2), dtype=np.int64)
    k = ext.fold_chain(rank, own, d1, b1, gci, perm, offsets, n_keys, chain, tails)
    # kept as an immutable bytes object of its k rows (a read-only array over it): the C replay then checks it
    # once and reads it in place (no copy), and the n-row buffer goes back to the allocator
    rows = np.frombuffer(chain[:k].tobytes(), dtype=np.int64).reshape(k, 6)
    segments = np.arange(pp, dtype=np.intp) * (vpp * m)  # every rank holds vpp * m forwards (checked)
    return _plan_fields(ops, offsets, vpp, m, cols, perm, LazyChain(rows, n_keys), tuple(map(tuple, tails.tolist())),
                        mem=(mem_alive, mem_b, mem_w, f_rank.astype(np.intp, copy=False), segments),
                        peak_in_flight=tuple(peak.tolist()), op_counts=op_counts, splits_bw=bool(split),
                        steps_cols=_Columns(ops, offsets, pp, vpp, layout, m))


class _Columns:
    """A C-compiled plan's per-op columns (rank, key, d1, b1, d2, cost index), computed again when its steps are
    first read (a timeline, a Gantt chart): the plan does not keep them (~56 bytes an op). Picklable; where the
    extension is not loaded (an unpickled plan elsewhere), the numpy passes compute the same columns."""

    __slots__ = ("ops", "offsets", "pp", "vpp", "layout", "m")

    def __init__(self, ops: np.ndarray, offsets: np.ndarray, pp: int, vpp: int, layout: Layout, m: int) -> None:
        self.ops, self.offsets, self.pp, self.vpp, self.layout, self.m = ops, offsets, pp, vpp, layout, m

    def __call__(self) -> tuple[np.ndarray, ...]:
        ext = _jit.extension()
        if ext is None:
            return _compile_numpy(self.ops, self.offsets, self.pp, self.vpp, self.layout, self.m)["steps"].columns()
        return _native_tables(ext, self.ops, self.offsets, self.pp, self.vpp, self.layout, self.m)[1]

    def __getstate__(self) -> tuple:
        return self.ops, self.offsets, self.pp, self.vpp, self.layout, self.m

    def __setstate__(self, state: tuple) -> None:
        self.ops, self.offsets, self.pp, self.vpp, self.layout, self.m = state


def _plan_fields(ops: np.ndarray, offsets: np.ndarray, vpp: int, m: int, cols: tuple[np.ndarray, ...],
                 perm: np.ndarray, chain: LazyChain, tails: tuple[tuple[int, int], ...], *,
                 mem: tuple[np.ndarray, ...], peak_in_flight: tuple[int, ...], op_counts: np.ndarray,
                 splits_bw: bool, steps_cols: Callable[[], tuple[np.ndarray, ...]] | None = None) -> dict:
    """The CompiledOrder fields from the per-op columns (rank, key, d1, b1, d2, cost index), the evaluation order,
    the folded chain and tails, and the memory tables (alive, B, W, their rows' ranks, the ranks' first rows).
    ``steps_cols``: how the steps get the columns again when first read, so the plan need not keep them (else it
    keeps ``cols``)."""
    pp = len(offsets) - 1
    # the per-rank Op tuples only build_order, a timeline and a Gantt chart read: built on first use too
    order = LazyOrder(ops, offsets, vpp)
    # the per-op steps only a timeline (and a Gantt chart) reads: built on first use
    steps = LazySteps(steps_cols if steps_cols is not None else cols, perm)
    mem_alive, mem_b, mem_w, mem_row_rank, segments = mem
    return dict(chain=chain, tails=tails,
        chain_arrays=(chain.array, np.asarray(tails, dtype=np.int64).reshape(-1, 2)),
        order=order, steps=steps, step_slots=perm.astype(np.intp, copy=False),
        rank_offsets=tuple(offsets.tolist()), n_keys=3 * m * pp * vpp,
        op_counts=tuple(tuple(row) for row in op_counts.reshape(pp, 4 * vpp).tolist()),
        mem_row_rank=mem_row_rank, mem_alive=mem_alive, mem_b=mem_b, mem_w=mem_w,
        mem_segments=segments, peak_in_flight=peak_in_flight, splits_bw=splits_bw)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a plan's tables are built: they are tuples of ints and
    of interned Ops (no cycles to find), but their tens of thousands of allocations would otherwise
    trigger collections that walk the caller's whole heap (a search space's points), ~40% of the cost."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def flat_rows(rank: np.ndarray, own: np.ndarray, d1: np.ndarray, b1: np.ndarray, d2: np.ndarray,
              gci: np.ndarray, perm: np.ndarray) -> tuple[tuple[int, int, int, int, int, int], ...]:
    """The timed pass's steps from per-slot columns (slot = rank offset + position) and an evaluation
    order ``perm`` (the steps' slots): one int tuple per op, (rank, key, dep1, boundary1, dep2, cost index)."""
    return tuple(zip(*(col[perm].tolist() for col in (rank, own, d1, b1, d2, gci))))


class _LazyRows(Sequence):
    """A tuple of rows (int tuples, or each rank's Op tuple) built from the compiler's arrays on first read
    (:meth:`_build`, with the collector paused), reading as that tuple: most projections never read them."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: tuple[tuple[int, ...], ...] | None = None

    def _build(self) -> tuple[tuple[int, ...], ...]:
        raise NotImplementedError

    def rows(self) -> tuple[tuple[int, ...], ...]:
        if self._rows is None:
            with _collector_paused():
                self._rows = self._build()
        return self._rows

    def __getitem__(self, i):  # type: ignore[override]
        return self.rows()[i]

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


class LazySteps(_LazyRows):
    """``CompiledOrder.steps`` (see :func:`flat_rows`) from the compiler's columns, built on first use: a
    projection replays the folded chain and never reads them. ``cols`` is the columns, or a function that
    computes them again (the C compile keeps no per-op columns in a plan: a timeline recompiles them)."""

    __slots__ = ("_cols", "_perm")

    def __init__(self, cols: tuple[np.ndarray, ...] | Callable[[], tuple[np.ndarray, ...]], perm: np.ndarray) -> None:
        super().__init__()
        self._cols, self._perm = cols, perm

    def columns(self) -> tuple[np.ndarray, ...]:
        """The per-op columns the steps are made of (computed again where the plan does not keep them)."""
        return self._cols() if callable(self._cols) else self._cols

    def _build(self) -> tuple[tuple[int, int, int, int, int, int], ...]:
        return flat_rows(*self.columns(), self._perm)

    def __len__(self) -> int:
        return len(self._perm)


class LazyOrder(_LazyRows):
    """``CompiledOrder.order`` (per rank, its tuple of interned :class:`Op`) from the order's ``(n, 3)`` rows and
    the ranks' offsets, built on first use: a projection never reads it (~8 % of a new plan's compile)."""

    __slots__ = ("_ops", "_offsets", "_vpp")

    def __init__(self, ops: np.ndarray, offsets: np.ndarray, vpp: int) -> None:
        super().__init__()
        self._ops, self._offsets, self._vpp = ops, offsets, vpp

    def _build(self) -> tuple[tuple[Op, ...], ...]:
        at = self._offsets.tolist()
        return tuple(array_to_ops(self._ops[a:b], self._vpp) for a, b in zip(at[:-1], at[1:]))

    def __len__(self) -> int:
        return len(self._offsets) - 1


def _chain_tuples(chain: np.ndarray, n_keys: int) -> tuple[tuple[int, int, int, int, int, int], ...]:
    """The chain's step tuples from its ``(n, 6)`` array. The Python replay reads a step's key, predecessor and
    dependency as list indices: the keys are made in step order and a predecessor or dependency is the very int
    object of the key it names (as the step-by-step fold shares them), which keeps the loop's reads in cache
    (fresh ints per column replay ~2 % slower)."""
    if len(chain) == 0:
        return ()
    key, prev, fold, dep, bnd, ci = chain.T
    keys = key.tolist()
    by_key: list[int | None] = [None] * (n_keys + 2)  # key k at k + 1; -1 (no step) at 0
    by_key[0] = -1
    list(map(by_key.__setitem__, (key + 1).tolist(), keys))

    def named(col: np.ndarray) -> Sequence[int]:
        idx = (col + 1).tolist()
        return [by_key[idx[0]]] if len(idx) == 1 else itemgetter(*idx)(by_key)  # type: ignore[list-item]
    return tuple(zip(keys, named(prev), fold.tolist(), named(dep), bnd.tolist(), ci.tolist()))


class LazyChain(_LazyRows):
    """``CompiledOrder.chain`` from the compiler's ``(n, 6)`` int64 array (the compiled replay's input as is),
    its step tuples built on first use: a process that replays with ``_jit`` never reads them (they were ~half
    of a new plan's compile time)."""

    __slots__ = ("array", "_n_keys")

    def __init__(self, array: np.ndarray, n_keys: int) -> None:
        super().__init__()
        self.array, self._n_keys = array, n_keys

    def _build(self) -> tuple[tuple[int, int, int, int, int, int], ...]:
        return _chain_tuples(self.array, self._n_keys)

    def __len__(self) -> int:
        return len(self.array)


def fold_columns(rank: np.ndarray, own: np.ndarray, d1: np.ndarray, b1: np.ndarray, gci: np.ndarray,
                 perm: np.ndarray, offsets: np.ndarray, n_keys: int
                 ) -> tuple[LazyChain, tuple[tuple[int, int], ...]]:
    """``CompiledOrder``'s (chain, tails) from per-slot columns and the evaluation order ``perm``: the same fold
    as ``simulator.fold_steps`` (which walks the steps one by one), computed with numpy. A rank's steps come in
    its slot order (the rank predecessor first), so "the rank's previous op" is the previous slot. The C
    extension's ``fold_chain`` computes the same chain and tails op by op (:func:`_compile_native`)."""
    n = len(own)
    slots = np.arange(n, dtype=np.int64)
    awaited = np.zeros(n_keys + 1, dtype=bool)
    awaited[d1[b1 >= 0]] = True
    # an op no other rank waits for and with no cross-rank input folds into its rank's next op
    foldable = (b1 < 0) & ~awaited[own]
    start = offsets[rank]  # the slot of each slot's rank's first op
    first = slots == start
    last = slots == offsets[rank + 1] - 1
    next_foldable = np.zeros(n, dtype=bool)
    next_foldable[:-1] = foldable[1:] & ~last[:-1]
    # emitted: every other op, and a foldable one followed by another (it becomes a step of its own, emitted
    # where that next one is met); each evaluation position then emits at most one step
    emitted = ~foldable | next_foldable
    pos = np.empty(n, dtype=np.int64)
    pos[perm] = slots
    at = pos.copy()
    standalone = np.flatnonzero(foldable & next_foldable)
    at[standalone] = pos[standalone + 1]
    # the rank predecessor's key: the latest emitted op before it on the rank
    latest = np.maximum.accumulate(np.where(emitted, slots, -1))
    before = np.full(n, -1, dtype=np.int64)
    before[1:] = latest[:-1]
    before[before < start] = -1
    prev = np.where(before >= 0, own[before], -1)
    fold = np.full(n, -1, dtype=np.int64)
    fold[1:] = np.where(foldable[:-1] & ~first[1:], gci[:-1], -1)
    fold[foldable] = -1
    dep = np.where(foldable | (b1 < 0), -1, d1)
    bnd = np.where(foldable, -1, b1)
    sel = np.flatnonzero(emitted)
    order = sel[np.argsort(at[sel], kind="stable")]
    chain = np.empty((len(order), 6), dtype=np.int64)
    for j, col in enumerate((own, prev, fold, dep, bnd, gci)):
        chain[:, j] = col[order]
    tails = []
    for r in range(len(offsets) - 1):
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        if lo == hi:
            tails.append((-1, -1))
            continue
        e = int(latest[hi - 1])
        tails.append((int(own[e]) if e >= lo else -1, int(gci[hi - 1]) if foldable[hi - 1] else -1))
    return LazyChain(chain, n_keys), tuple(tails)


def _tick_order(own: np.ndarray, d1: np.ndarray, d2: np.ndarray, offsets: np.ndarray, n: int,
                n_keys: int) -> np.ndarray | None:
    """Op indices sorted by longest-path level (unit op lengths); None on a cycle or slow convergence.

    Gauss-Seidel relaxation: sweep the ranks down (0 .. pp-1, the direction forwards flow) and back
    up to rank 0 (the backwards), each rank's ticks from the latest ticks of its dependencies; pipeline
    orders settle in one round trip (78 of the bench's 80 cold plans; sweeping back up to rank 1 only, none
    did). Ticks only grow from below, so the first round after which every
    rank's ticks already satisfy their dependencies (one check over all ranks at once) holds the least
    fixed point: the longest-path levels, the same ticks as a further round that changes nothing.
    The C extension's ``tick_order`` gives the same permutation (the levels are unique) by advancing each rank
    while its next op's inputs are placed, then a counting sort (:func:`_compile_native`)."""
    slot_of = np.full(n_keys + 1, n, dtype=np.int64)  # key -1 (no dependency) -> sentinel slot n
    slot_of[own] = np.arange(n, dtype=np.int64)
    s1 = slot_of[d1]
    s2 = slot_of[d2]
    tick = np.full(n + 1, -1, dtype=np.int64)
    pp = len(offsets) - 1
    # per non-empty rank (the slices made once): its ticks (a view), its dependencies' slots, its positions
    ranks = []
    for r in range(pp):
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        if lo < hi:
            pos = np.arange(hi - lo, dtype=np.int64)
            ranks.append((tick[lo:hi], s1[lo:hi], s2[lo:hi], 1 - pos, pos))
    sweep = ranks + ranks[-2::-1]
    # the fixed-point check over all ranks: one running max whose ranks are lifted apart by more than the
    # range of (deps + 1 - pos), 2n + 1, so no rank's maximum carries into the next (a segmented scan)
    lens = np.diff(offsets)
    lift = np.repeat(np.arange(pp, dtype=np.int64) * (4 * n + 4), lens)
    pos_all = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], lens)
    one_minus_pos_all = lift + 1 - pos_all
    pos_less_lift = pos_all - lift
    now = tick[:n]
    for _ in range(_MAX_ROUNDS):
        for cur, dep1, dep2, one_minus_pos, pos in sweep:
            # tick[i] = max(tick[rank predecessor] + 1, deps + 1) = pos + running max of (deps + 1 - pos)
            ext = np.maximum(tick[dep1], tick[dep2])
            ext += one_minus_pos
            np.maximum.accumulate(ext, out=ext)
            ext += pos
            if ext[-1] >= n:
                return None  # a level beyond the op count: the graph has a cycle (deadlock)
            cur[:] = ext
        ext = np.maximum(tick[s1], tick[s2])
        ext += one_minus_pos_all
        np.maximum.accumulate(ext, out=ext)
        ext += pos_less_lift
        if np.array_equal(ext, now):
            return np.argsort(now, kind="stable")
    return None


def rows(kind: int | np.ndarray, mb: np.ndarray, chunk: int | np.ndarray = 0) -> np.ndarray:
    """``(n, 3)`` op rows (kind code, mb, chunk) from broadcastable columns."""
    mb = np.asarray(mb, dtype=np.int64)
    out = np.empty((mb.size, 3), dtype=np.int64)
    out[:, 0] = kind
    out[:, 1] = mb
    out[:, 2] = chunk
    return out


def warmup_steady_cooldown(fwd: np.ndarray, bwd: np.ndarray, warmup: int) -> np.ndarray:
    """The 1F1B shape in array form: ``fwd[:warmup]``, then pairs (``fwd[warmup + k]``, ``bwd[k]``),
    then the remaining backwards (both sequences have the same length)."""
    total = len(fwd)
    steady = np.stack([fwd[warmup:], bwd[:total - warmup]], axis=1).reshape(-1, 3)
    return np.concatenate([fwd[:warmup], steady, bwd[total - warmup:]])
