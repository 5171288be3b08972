"""ilp: optimal weight-gradient (W) placement on the ZB-H1 skeleton, solved as a MILP (vpp=1).

What is fixed and what is optimised:
- Each rank's F/B order is ZB-H1's (1F1B warm-up ``pp - r - 1``, then F/B alternation). The W's are
  placed freely, subject to W(j) after B(j) on its rank, and to a memory cap (default: the peak of
  ``zero_bubble`` under the same costs, so ZB-H1 itself is feasible and ilp <= zero_bubble always).
- With vpp=1 every W of a rank costs the same and nothing depends on a W, so W identities do not
  matter: W's run FIFO and the decision is only *how many* W's follow each F/B op.

Formulation (exact, no big-M), in prefix counts: integer ``N[r,k]`` = W's run on rank r up to and including
the slot right after its k-th F/B op (so ``N[r,k] - N[r,k-1]`` W's follow op k), continuous start times
``t[r,k]`` and the makespan T; minimise T subject to
  sequence   t[r,k+1] >= t[r,k] + d[r,k] + w_r * (N[r,k] - N[r,k-1])
  data       t[op] >= t[dep] + d[dep] + p2p(boundary)            (F down, B up the pipeline)
  makespan   T >= t[r,last] + d[r,last] + w_r * (N[r,last] - N[r,last-1])
  order      N[r,k] >= N[r,k-1];   N[r,last] = m;   W after its B: N[r,k] <= #B in ops 0..k  (a bound)
  memory     after each F: a_r * (#F - frac * #B - (1 - frac) * N[r,k-1]) <= cap, i.e. a lower bound on
             N[r,k-1], rounded up to an integer.
For fixed N the smallest feasible times are exactly the simulator's (both are the longest-path
max-plus recursion), so the MILP optimum IS the optimal simulated makespan over all W placements.
The prefix form has a handful of non-zeros per row (the per-op count form had a prefix sum per row,
O(ops^2) non-zeros) and the same LP relaxation.

Solve (:func:`solve_w_placement`), cheapest proof first: ZB-H1's own placement, if it meets the
critical-path bound (``lower_bound_s``) or the LP relaxation's bound; else the LP point rounded up,
down or to nearest (each is a valid placement), if one meets the LP bound; else the MILP, told that only
placements better than the best known one count. On pipeline costs the LP bound is usually tight: on
random Mixtral 8x22B search points (quantised costs) 87 of 152 solves end at ZB-H1, 40 at a rounded LP
point and 24 need the MILP. Where several placements are optimal, the first of that sequence is the
one returned (ZB-H1's when it is optimal).

Work budget (:class:`IlpBudget`), independent of the clock so the same configuration gets the same
schedule on any machine, busy or idle: problems with more than ``max_ops`` F/B ops are not attempted,
and HiGHS (scipy.optimize.milp, serial and deterministic) stops after ``node_limit`` branch-and-bound
nodes. A wall-clock cap stays only as a safety net; when it is hit the note says so (that one result
then depends on machine speed). When the optimum is not proven, the best known order (the solver's
incumbent, a rounded LP point or ZB-H1's placement, whichever simulates faster) is returned with
``approximate=True`` and the reason in the note. Results are cached per (pp, m, scale-free costs, budget):
:func:`normalised` divides the times by the largest op and the activations by the largest one, so
configurations whose (quantised) costs differ only by a factor share one solve.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from oracle.pipeline.fast_compile import array_to_ops
from oracle.pipeline.schedules import Built, Order, is_arrays, register
from oracle.pipeline.types import StageCosts

MIP_REL_GAP = 1e-7
"""Relative optimality gap accepted as 'optimal' (float times)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IlpBudget:
    """How much work the MILP may do; every limit but the safety net is counted, not timed."""

    max_ops: int
    """Largest F/B op count (2 * pp * m) handed to the solver; larger problems keep ZB-H1's placement."""
    node_limit: int
    """Branch-and-bound nodes HiGHS may explore (scipy ``milp`` option ``node_limit``)."""
    safety_time_limit_s: float
    """Wall-clock cap against a pathological solve; reported in the note when hit (machine dependent)."""
    rel_gap: float = MIP_REL_GAP
    """Relative gap to a proven lower bound at which a placement is accepted. Above ``MIP_REL_GAP`` (search
    mode) the cheap primal placements (:func:`list_schedule`) are tried first and the LP relaxation's duals are
    kept per (pp, m) as lower bounds for later problems (:func:`_dual_bound`), so most solves need no LP."""


DEFAULT_BUDGET = IlpBudget(max_ops=4096, node_limit=10_000, safety_time_limit_s=600.0)
"""Single projections: every bundled size solves to proven optimality well inside it."""
SEARCH_REL_GAP = 1e-2
"""Search mode's optimality gap: 1 %, under the error of the quantised costs it solves on (a step is
1/32 of the largest op, ~3 %), so a placement within it of the lower bound is as good as the optimum there."""
SEARCH_BUDGET = IlpBudget(max_ops=1024, node_limit=200, safety_time_limit_s=120.0, rel_gap=SEARCH_REL_GAP)
"""Search loops (projector ``fast_schedules``): at most ~1024 ops keeps a solve to seconds on 2 cores."""
MAX_EXACT_OPS = DEFAULT_BUDGET.max_ops
"""Largest F/B op count (2 * pp * m) handed to the MILP solver by default."""
_BUDGET: contextvars.ContextVar[IlpBudget] = contextvars.ContextVar("ilp_budget", default=DEFAULT_BUDGET)


@dataclass(frozen=True, slots=True)
class WPlacement:
    """The solved placement."""

    order: Order
    makespan_s: float
    optimal: bool
    note: str
    time_capped: bool = False
    """The wall-clock safety cap stopped the solver (the only machine-dependent outcome)."""


def _ops(order: list[np.ndarray]) -> Order:
    """An order in array form as per-rank Op lists."""
    return [list(array_to_ops(a, 1)) for a in order]


def _fallback(zb: Order, span: float, note: str, capped: bool = False) -> WPlacement:
    return WPlacement(zb, span, False, note, capped)


def _model(pp: int, m: int, costs: StageCosts, cap: float):
    """The MILP in prefix-count form (see the module docstring): variables ``t`` (n_ops), ``N`` (n_ops), ``T``;
    returns (A as COO parts, row bounds, variable bounds, the F/B arrays) or a reason string when the memory
    cap cannot be met at all."""
    from oracle.pipeline.schedules.one_f_one_b import fb_array

    fb = [fb_array(pp, r, m, backward="B")[:, :2] for r in range(pp)]
    sizes = [len(a) for a in fb]
    offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n_ops = int(offset[-1])
    T = 2 * n_ops
    lat = costs.boundary_p2p_s()
    frac = costs.b_release_fraction
    pos = np.empty((pp, 2, m), dtype=np.int64)  # global index of rank r's F (0) / B (1) of micro-batch mb
    for r, a in enumerate(fb):
        pos[r, a[:, 0], a[:, 1]] = offset[r] + np.arange(len(a))
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    n_rows = 0

    def add(cs: list[tuple[np.ndarray, np.ndarray | float]], lower: np.ndarray) -> None:
        nonlocal n_rows
        k = len(lower)
        ids = n_rows + np.arange(k)
        for c, v in cs:
            rows.append(ids)
            cols.append(c)
            vals.append(np.broadcast_to(np.asarray(v, dtype=float), (k,)))
        lo.append(lower)
        n_rows += k

    var_lo = np.zeros(2 * n_ops + 1)
    var_hi = np.full(2 * n_ops + 1, np.inf)
    for r, a in enumerate(fb):
        o, n = int(offset[r]), len(a)
        is_f = a[:, 0] == 0
        w = costs.w_s[r][0]
        d = np.where(is_f, costs.f_s[r][0], costs.b_s[r][0])
        t = o + np.arange(n)
        N = n_ops + t
        nxt = np.append(t[1:], T)
        # sequence: t[k+1] >= t[k] + d[k] + w (N[k] - N[k-1])   (the last op: T >= ...)
        add([(nxt, 1.0), (t, -1.0), (N, -w)], d)
        rows.append(n_rows - n + np.arange(1, n))
        cols.append(N[:-1])
        vals.append(np.full(n - 1, w))
        # prefix counts never decrease: N[k] >= N[k-1]
        add([(N[1:], 1.0), (N[:-1], -1.0)], np.zeros(n - 1))
        if r > 0:  # F(mb) after F(mb) of the rank above (+ its boundary's p2p)
            add([(pos[r, 0], 1.0), (pos[r - 1, 0], -1.0)], np.full(m, costs.f_s[r - 1][0] + lat[r - 1]))
        if r < pp - 1:  # B(mb) after B(mb) of the rank below
            add([(pos[r, 1], 1.0), (pos[r + 1, 1], -1.0)], np.full(m, costs.b_s[r + 1][0] + lat[r]))
        n_b = np.cumsum(~is_f)
        var_hi[N] = n_b  # W(j) after B(j): at most as many W's as B's so far
        var_lo[N[-1]] = m
        act = costs.act_bytes[r][0]
        if act > 0:
            # after each F: act * (#F - frac #B - (1 - frac) #W before it) <= cap
            need = np.cumsum(is_f) - frac * n_b - cap / act
            k = np.flatnonzero(is_f & (need > 1e-12))
            if len(k):
                if frac >= 1.0 or k[0] == 0:
                    return "memory cap infeasible"
                low = np.ceil(need[k] / (1.0 - frac) - 1e-7)
                np.maximum.at(var_lo, N[k - 1], low)
    return (np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), np.concatenate(lo), n_rows,
            var_lo, var_hi, n_ops, fb)


def solve_w_placement(pp: int, num_microbatches: int, costs: StageCosts, *, mem_cap_bytes: float | None = None,
                      budget: IlpBudget = DEFAULT_BUDGET) -> WPlacement:
    """Optimal W placement on the ZB-H1 F/B skeleton (see the module docstring)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    from oracle.pipeline import build_order, run_schedule
    from oracle.pipeline.schedules.zero_bubble import zb_h1_array
    from oracle.pipeline.simulator import lower_bound_s

    m = num_microbatches
    zb = build_order("zero_bubble", pp, 1, m)
    zb_arrays = [zb_h1_array(pp, r, m) for r in range(pp)]
    zb_res = run_schedule("zero_bubble", pp, 1, m, costs, timeline=False)
    zb_span = zb_res.makespan_s
    cap = max(zb_res.peak_activation_bytes) if mem_cap_bytes is None else float(mem_cap_bytes)
    cap_note = "zero_bubble's peak activation memory" if mem_cap_bytes is None else f"a memory cap of {cap:.4g} bytes"
    n_ops = 2 * pp * m
    if n_ops > budget.max_ops:
        return _fallback(zb, zb_span, _over_budget(n_ops, budget))
    proven = f"optimal W placement (gap <= {MIP_REL_GAP:g}) under {cap_note}"
    zb_ok = max(zb_res.peak_activation_bytes) <= cap * (1 + 1e-9)  # ZB-H1 itself meets the cap
    if budget.rel_gap > MIP_REL_GAP:
        return _solve_within_gap(pp, m, costs, cap, cap_note, budget, zb, zb_arrays if zb_ok else None, zb_span)
    if zb_ok and zb_span <= lower_bound_s(pp, 1, "interleaved", m, costs) * (1 + MIP_REL_GAP):
        return WPlacement(zb, zb_span, True, proven + "; ZB-H1's placement meets the critical-path bound")
    model = _model(pp, m, costs, cap)
    if isinstance(model, str):
        return _fallback(zb, zb_span, f"{model}; ZB-H1 used")
    r_idx, c_idx, v, lo, n_rows, var_lo, var_hi, n_ops, fb = model
    n_var = 2 * n_ops + 1
    A = csr_matrix((v, (r_idx, c_idx)), shape=(n_rows, n_var))
    cost = np.zeros(n_var)
    cost[-1] = 1.0
    cons = LinearConstraint(A, lo, np.full(n_rows, np.inf))
    # the LP relaxation first: on pipeline costs it is usually tight, and ZB-H1 or the LP's own point meets it
    lp = milp(cost, constraints=cons, bounds=Bounds(var_lo, var_hi))
    if lp.x is None:
        return _fallback(zb, zb_span, f"LP relaxation found no solution ({lp.message}); ZB-H1 used")
    bound = lp.fun * (1 + MIP_REL_GAP)
    if zb_ok and zb_span <= bound:
        return WPlacement(zb, zb_span, True, proven + "; ZB-H1's placement meets the LP bound")
    best, best_span = (zb_arrays, zb_span) if zb_ok else (None, np.inf)

    # the LP point rounded up, down and to nearest (each keeps the integer bounds and the order of the counts)
    x = lp.x[n_ops:2 * n_ops]
    for rounded in (np.ceil(x - 1e-6), np.floor(x + 1e-6), np.round(x)):
        order, span = _span(fb, rounded.astype(np.int64), pp, m, costs)
        if span <= bound:
            return WPlacement(_ops(order), span, True, proven + "; the LP optimum rounded meets the LP bound")
        if span < best_span:
            best, best_span = order, span
    integrality = np.zeros(n_var)
    integrality[n_ops:2 * n_ops] = 1
    if best is not None:
        var_hi = var_hi.copy()
        var_hi[-1] = best_span  # only placements at least as good as the best known
    res = milp(cost, constraints=cons, integrality=integrality, bounds=Bounds(var_lo, var_hi),
               options={"node_limit": budget.node_limit, "time_limit": budget.safety_time_limit_s,
                        "mip_rel_gap": MIP_REL_GAP})
    if res.x is not None:
        order, span = _span(fb, np.round(res.x[n_ops:2 * n_ops]).astype(np.int64), pp, m, costs)
        if span < best_span:
            best, best_span = order, span
    if res.status == 0 and best is not None:
        return WPlacement(_ops(best), best_span, True, proven)
    # status 1 = iteration/time limit: within the node budget it can only be the wall-clock cap
    capped = res.status == 1 and (res.mip_node_count is None or res.mip_node_count < budget.node_limit)
    capped_note = (f"; the {budget.safety_time_limit_s:g} s safety time cap stopped the solver, so this order "
                   f"depends on machine speed" if capped else "")
    if best is None:
        return _fallback(zb, zb_span, f"MILP found no solution ({res.message}); ZB-H1 used" + capped_note, capped)
    return _fallback(_ops(best), best_span, f"MILP stopped before proving optimality ({res.message}); best known "
                                            f"placement used" + capped_note, capped)


def _span(fb: list[np.ndarray], prefix: np.ndarray, pp: int, m: int, costs: StageCosts
          ) -> tuple[list[np.ndarray], float]:
    """(order in array form, simulated makespan) of the placement with prefix counts ``prefix``."""
    from oracle.pipeline.simulator import compile_order_arrays, run_compiled

    arrays = _prefix_arrays(fb, prefix, m)
    return arrays, run_compiled(compile_order_arrays(arrays, pp, 1, "interleaved", m), costs,
                                timeline=False).makespan_s


@dataclass(frozen=True, slots=True)
class _Skeleton:
    """The ZB-H1 F/B skeleton of (pp, m) as flat per-op lists (global op index = rank offset + position)."""

    rank: list[int]
    dep: list[int]
    """The op this one waits for on the neighbouring rank (F from the rank above, B from below), or -1."""
    first: list[bool]
    """First op of its rank (no W slot before it)."""
    is_b: list[bool]
    b_upto: list[int]
    """B's of its rank in ops 0..k: the most W's that may have run by the slot after op k."""
    topo: list[int]
    """Every op in an order that respects both the ranks' sequences and the data edges."""
    last: list[int]


@lru_cache(maxsize=256)
def _skeleton(pp: int, m: int) -> _Skeleton:
    from oracle.pipeline.schedules.one_f_one_b import fb_array

    fb = [fb_array(pp, r, m, backward="B")[:, :2] for r in range(pp)]
    sizes = [len(a) for a in fb]
    offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    pos = np.empty((pp, 2, m), dtype=np.int64)
    for r, a in enumerate(fb):
        pos[r, a[:, 0], a[:, 1]] = offset[r] + np.arange(len(a))
    dep = np.full(int(offset[-1]), -1, dtype=np.int64)
    for r in range(pp):
        if r > 0:
            dep[pos[r, 0]] = pos[r - 1, 0]
        if r < pp - 1:
            dep[pos[r, 1]] = pos[r + 1, 1]
    deps = dep.tolist()
    done = [False] * len(deps)
    ptr, topo = [0] * pp, []
    while len(topo) < len(deps):  # advance every rank as far as its data dependencies allow
        for r in range(pp):
            while ptr[r] < sizes[r]:
                op = int(offset[r]) + ptr[r]
                if deps[op] >= 0 and not done[deps[op]]:
                    break
                done[op] = True
                topo.append(op)
                ptr[r] += 1
    first = np.zeros(len(deps), dtype=bool)
    first[offset[:-1]] = True
    return _Skeleton(rank=np.repeat(np.arange(pp), sizes).tolist(), dep=deps, first=first.tolist(),
                     is_b=np.concatenate([a[:, 0] == 1 for a in fb]).tolist(),
                     b_upto=np.concatenate([np.cumsum(a[:, 0] == 1) for a in fb]).tolist(), topo=topo,
                     last=(offset[1:] - 1).tolist())


def _per_rank(costs: StageCosts) -> tuple[tuple[float, ...], list[float], list[float], list[float]]:
    """(boundary p2p, F, B, W) per rank of vpp=1 costs, as plain floats for the Python loops."""
    return (costs.boundary_p2p_s(), [r[0] for r in costs.f_s], [r[0] for r in costs.b_s],
            [r[0] for r in costs.w_s])


def list_schedule(pp: int, m: int, costs: StageCosts, n_low: np.ndarray) -> np.ndarray:
    """A primal W placement (prefix counts, as in the MILP): play the ZB-H1 skeleton forward and, before each
    F/B op, run the W's the memory cap forces (``n_low``: the MILP's lower bounds on the counts) and then
    enough W's to cover the idle time until the op's input arrives (rounded up: a W that overhangs the gap
    delays the op by less than it would add at the end). On pipeline costs this is often within a fraction of
    a percent of the LP bound; it never breaks a constraint (W after its B, the memory cap, every W run)."""
    sk = _skeleton(pp, m)
    lat, f, b, w = _per_rank(costs)
    n_low = n_low.tolist()
    fin = [0.0] * len(sk.dep)
    end, cnt, out = [0.0] * pp, [0] * pp, [0] * len(sk.dep)
    rank, dep, first, is_b, b_upto = sk.rank, sk.dep, sk.first, sk.is_b, sk.b_upto
    for op in sk.topo:
        r, j = rank[op], dep[op]
        if j < 0:
            ready = 0.0
        elif rank[j] < r:  # an F from the rank above
            ready = fin[j] + lat[r - 1]
        else:  # a B from the rank below
            ready = fin[j] + lat[r]
        if not first[op]:
            k = op - 1
            do = max(0, n_low[k] - cnt[r])
            avail = b_upto[k] - cnt[r]
            if avail > do and w[r] > 0:
                gap = ready - end[r] - do * w[r]
                if gap > 0:
                    do = min(avail, do + math.ceil(gap / w[r] - 1e-9))
            cnt[r] += do
            end[r] += do * w[r]
            out[k] = cnt[r]
        start = end[r] if end[r] > ready else ready
        end[r] = fin[op] = start + (b[r] if is_b[op] else f[r])
    for r in range(pp):
        out[sk.last[r]] = m
    n = np.array(out, dtype=np.int64)
    for r in range(pp):  # counts never decrease (a forced bound may sit below an earlier fill)
        lo_, hi_ = sk.last[r - 1] + 1 if r else 0, sk.last[r] + 1
        n[lo_:hi_] = np.maximum.accumulate(n[lo_:hi_])
    return n


def _makespan(pp: int, m: int, costs: StageCosts, n: np.ndarray) -> float:
    """The makespan of the placement with prefix counts ``n``: the MILP's longest-path times (the simulator's,
    without its blocking-p2p variant), evaluated in plain Python for the local search of :func:`_mix_ranks`."""
    sk = _skeleton(pp, m)
    lat, f, b, w = _per_rank(costs)
    cnt = n.tolist()
    fin = [0.0] * len(cnt)
    end = [0.0] * pp
    rank, dep, first, is_b = sk.rank, sk.dep, sk.first, sk.is_b
    for op in sk.topo:
        r, j = rank[op], dep[op]
        ready = 0.0 if j < 0 else fin[j] + (lat[r - 1] if rank[j] < r else lat[r])
        if not first[op]:
            end[r] += (cnt[op - 1] - (0 if first[op - 1] else cnt[op - 2])) * w[r]
        start = end[r] if end[r] > ready else ready
        end[r] = fin[op] = start + (b[r] if is_b[op] else f[r])
    return max(end[r] + (m - cnt[sk.last[r] - 1]) * w[r] for r in range(pp))


def _mix_ranks(pp: int, m: int, costs: StageCosts, options: list[np.ndarray], target: float) -> np.ndarray:
    """A placement that takes each rank's counts from one of ``options`` (whole placements), chosen rank by
    rank (coordinate descent, two sweeps) for the smallest makespan; stops early once ``target`` is met."""
    sk = _skeleton(pp, m)
    spans = [_makespan(pp, m, costs, o) for o in options]
    cur = options[int(np.argmin(spans))].copy()
    best = min(spans)
    for _ in range(2):
        moved = False
        for r in range(pp):
            lo_, hi_ = (sk.last[r - 1] + 1 if r else 0), sk.last[r] + 1
            for o in options:
                if np.array_equal(o[lo_:hi_], cur[lo_:hi_]):
                    continue
                trial = cur.copy()
                trial[lo_:hi_] = o[lo_:hi_]
                span = _makespan(pp, m, costs, trial)
                if _better(span, best):
                    cur, best, moved = trial, span, True
            if best <= target:
                return cur
        if not moved:
            break
    return cur


_BNB = "branch and bound"
_DUALS: dict[tuple[int, int], list[np.ndarray]] = {}
"""LP duals of earlier search-mode problems per (pp, m): the rows of the MILP depend on (pp, m) only, so each
one gives a valid (Lagrangian) lower bound for any other problem of that size."""
_DUALS_KEPT = 8


def _dual_bound(key: tuple[int, int], A, lo: np.ndarray, var_lo: np.ndarray, var_hi: np.ndarray,
                upper: float) -> float:
    """The best Lagrangian lower bound on the makespan from the kept duals of size ``key``, over placements no
    slower than ``upper`` (which caps the times: every start time is at most the makespan); -inf if none.
    For any y >= 0: min T >= y.lo + sum_j min over [l_j, u_j] of (c_j - (A^T y)_j) x_j (weak duality)."""
    duals = _DUALS.get(key)
    if not duals:
        return -np.inf
    Y = np.array(duals)
    red = -(A.T @ Y.T)  # reduced costs, one column per kept dual
    red[-1] += 1.0  # the objective is T
    hi = np.where(np.isinf(var_hi), upper, var_hi)[:, None]
    low = var_lo[:, None]
    return float(np.max(Y @ lo + np.minimum(red * low, red * hi).sum(axis=0)))


def _better(span: float, than: float) -> bool:
    """``span`` beats ``than`` by more than float noise (simulations of two orders sum in different orders)."""
    return span < than * (1 - 1e-9)


def _solve_within_gap(pp: int, m: int, costs: StageCosts, cap: float, cap_note: str, budget: IlpBudget,
                      zb: Order, zb_arrays: list[np.ndarray] | None, zb_span: float) -> WPlacement:
    """Search mode: a placement within ``budget.rel_gap`` of a proven lower bound, cheapest proof first. The
    answer does not depend on which bound proves it (so not on what was solved before): the best of ZB-H1 and
    :func:`list_schedule` if it is within the gap of the LP bound (the critical-path bound and the kept duals
    are never above it), else the first LP rounding that is, else the MILP's."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp
    from scipy.sparse import csr_matrix

    from oracle.pipeline.simulator import lower_bound_s

    gap = budget.rel_gap
    model = _model(pp, m, costs, cap)
    if isinstance(model, str):
        return _fallback(zb, zb_span, f"{model}; ZB-H1 used")
    r_idx, c_idx, v, lo, n_rows, var_lo, var_hi, n_ops, fb = model

    crit = lower_bound_s(pp, 1, "interleaved", m, costs)

    def done(order: Order | list[np.ndarray], span: float, bound: float, how: str) -> WPlacement:
        # 'optimal' is judged on a bound every path computes alike: the LP or a kept dual that proves the
        # search gap would give a history-dependent flag (a kept dual is weaker than this problem's own LP)
        exact = span <= (max(crit, bound) if how == _BNB else crit) * (1 + MIP_REL_GAP)
        ops = order if order is zb else _ops(order)  # type: ignore[arg-type]
        what = (f"optimal W placement (gap <= {MIP_REL_GAP:g})" if exact else
                f"W placement within {gap:g} of the optimum (search gap)")
        return WPlacement(ops, span, exact, f"{what} under {cap_note}; {how}")

    heur = list_schedule(pp, m, costs, var_lo[n_ops:2 * n_ops].astype(np.int64))
    heur_order, heur_span = _span(fb, heur, pp, m, costs)
    best, best_span, who = (zb, zb_span, "ZB-H1's placement") if zb_arrays is not None else (None, np.inf, "")
    if _better(heur_span, best_span):  # not on float noise: the answer must not depend on the scale
        best, best_span, who = heur_order, heur_span, "the list-scheduled placement"
    if best is not None:
        if best_span <= crit * (1 + gap):
            return done(best, best_span, crit, who + " meets the critical-path bound")
    n_var = 2 * n_ops + 1
    A = csr_matrix((v, (r_idx, c_idx)), shape=(n_rows, n_var))
    key = (pp, m)
    if best is not None:
        kept = _dual_bound(key, A, lo, var_lo, var_hi, best_span)
        if best_span <= kept * (1 + gap):
            # kept <= this problem's LP bound, so the LP bound is met too: the note says so, as without duals
            return done(best, best_span, kept, who + " meets the LP bound")
    cost = np.zeros(n_var)
    cost[-1] = 1.0
    lp = linprog(cost, A_ub=-A, b_ub=-lo, bounds=np.stack([var_lo, var_hi], axis=1), method="highs")
    if lp.status != 0 or lp.x is None:
        return _fallback(zb, zb_span, f"LP relaxation found no solution ({lp.message}); ZB-H1 used")
    duals = _DUALS.setdefault(key, [])
    duals.append(np.maximum(-lp.ineqlin.marginals, 0.0))
    del duals[:-_DUALS_KEPT]
    bound = float(lp.fun)
    if best is not None and best_span <= bound * (1 + gap):
        return done(best, best_span, bound, who + " meets the LP bound")
    x = lp.x[n_ops:2 * n_ops]
    options = [heur]
    for rounded in (np.ceil(x - 1e-6), np.floor(x + 1e-6), np.round(x)):
        options.append(rounded.astype(np.int64))
        order, span = _span(fb, options[-1], pp, m, costs)
        if span <= bound * (1 + gap):
            return done(order, span, bound, "the LP optimum rounded meets the LP bound")
        if _better(span, best_span):
            best, best_span = order, span
    # each rank's counts from the best of those placements (a rank's rounding that helps alone often helps)
    order, span = _span(fb, _mix_ranks(pp, m, costs, options, bound * (1 + gap)), pp, m, costs)
    if span <= bound * (1 + gap):
        return done(order, span, bound, "the LP roundings mixed rank by rank meet the LP bound")
    if _better(span, best_span):
        best, best_span = order, span
    integrality = np.zeros(n_var)
    integrality[n_ops:2 * n_ops] = 1
    var_hi = var_hi.copy()
    var_hi[-1] = min(var_hi[-1], best_span)
    res = milp(cost, constraints=LinearConstraint(A, lo, np.full(n_rows, np.inf)), integrality=integrality,
               bounds=Bounds(var_lo, var_hi), options={"node_limit": budget.node_limit,
                                                       "time_limit": budget.safety_time_limit_s, "mip_rel_gap": gap})
    if res.x is not None:
        order, span = _span(fb, np.round(res.x[n_ops:2 * n_ops]).astype(np.int64), pp, m, costs)
        if _better(span, best_span):
            best, best_span = order, span
    if res.status == 0 and best is not None:
        bound = getattr(res, "mip_dual_bound", None)
        return done(best, best_span, best_span / (1 + gap) if bound is None else float(bound), _BNB)
    capped = res.status == 1 and (res.mip_node_count is None or res.mip_node_count < budget.node_limit)
    capped_note = (f"; the {budget.safety_time_limit_s:g} s safety time cap stopped the solver, so this order "
                   f"depends on machine speed" if capped else "")
    if best is None:
        return _fallback(zb, zb_span, f"MILP found no solution ({res.message}); ZB-H1 used" + capped_note, capped)
    return _fallback(best if best is zb else _ops(best), best_span,
                     f"MILP stopped before proving the search gap ({res.message}); best known placement used"
                     + capped_note, capped)


def _prefix_arrays(fb: list[np.ndarray], prefix: np.ndarray, m: int) -> list[np.ndarray]:
    """The order (array form, rows of kind code, mb, chunk) whose rank r runs ``prefix[k] - prefix[k-1]`` W's
    (FIFO) right after its k-th F/B op (``fb[r]``: rows of kind code, micro-batch; ``prefix`` all ranks')."""
    out, o = [], 0
    j = np.arange(m)
    for a in fb:
        n = len(a)
        after = np.searchsorted(prefix[o:o + n], j, side="right")  # W(j) follows the first op with prefix > j
        keys = np.concatenate([np.arange(n) * (m + 1), after * (m + 1) + 1 + j])
        kind = np.concatenate([a[:, 0], np.full(m, 2)])
        mb = np.concatenate([a[:, 1], j])
        sel = np.argsort(keys, kind="stable")
        out.append(np.stack([kind[sel], mb[sel], np.zeros(n + m, dtype=np.int64)], axis=1))
        o += n
    return out


@contextlib.contextmanager
def work_budget(budget: IlpBudget) -> Iterator[None]:
    """Solve under ``budget`` inside this block (search loops use SEARCH_BUDGET); an unproven optimum
    comes back flagged approximate, as with the default budget."""
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)


@lru_cache(maxsize=4096)
def _cached(pp: int, m: int, costs: StageCosts, budget: IlpBudget) -> WPlacement:
    return solve_w_placement(pp, m, costs, budget=budget)


NORMAL_DIGITS = 12
"""Decimals kept of the scale-free costs (:func:`normalised`): absorbs the last-bit noise of a rescaling."""


def normalised(costs: StageCosts) -> StageCosts:
    """``costs`` without their scale: times over the largest op cost, activations over the largest one. The
    W placement problem is invariant under both scalings (every constraint is homogeneous in the times, and
    the memory cap is zero_bubble's peak, linear in the activations), so configurations whose costs differ
    by a factor share one solve; quantised search costs (``oracle.pipeline.quantized``) map onto a small set
    of integer patterns this way."""
    top = max(max(max(r) for r in costs.f_s), max(max(r) for r in costs.b_s), max(max(r) for r in costs.w_s))
    act_top = max(max(r) for r in costs.act_bytes)
    t = 1.0 / top if top > 0 else 1.0
    a = 1.0 / act_top if act_top > 0 else 1.0

    def scale(mat, k):
        return tuple(tuple(round(x * k, NORMAL_DIGITS) for x in row) for row in mat)
    p2p = (round(costs.p2p_s * t, NORMAL_DIGITS) if isinstance(costs.p2p_s, float)
           else tuple(round(x * t, NORMAL_DIGITS) for x in costs.p2p_s))
    return StageCosts.trusted(f_s=scale(costs.f_s, t), b_s=scale(costs.b_s, t), w_s=scale(costs.w_s, t),
                              act_bytes=scale(costs.act_bytes, a), p2p_s=p2p, p2p_blocking=costs.p2p_blocking,
                              b_release_fraction=costs.b_release_fraction)


def _over_budget(n_ops: int, budget: IlpBudget) -> str:
    return f"{n_ops} F/B ops > the ILP budget's max_ops={budget.max_ops}: MILP not attempted, ZB-H1 placement used"


def build_detailed(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Built:
    budget = _BUDGET.get()
    if 2 * pp * num_microbatches > budget.max_ops:  # nothing to solve: ZB-H1's order, as arrays (fast compile)
        from oracle.pipeline.schedules.zero_bubble import zb_h1_array
        return Built([zb_h1_array(pp, r, num_microbatches) for r in range(pp)], True,
                     _over_budget(2 * pp * num_microbatches, budget))
    if costs is None:
        costs = StageCosts.uniform(pp=pp, vpp=1, f_s=1.0, b_s=1.0, w_s=1.0)
    sol = _cached(pp, num_microbatches, normalised(costs), budget)
    return Built([list(ops) for ops in sol.order], not sol.optimal, sol.note)


@register("ilp", layout="interleaved", splits_bw=True, vpp_rule="one", cost_aware=True, position=30,
          in_flight=lambda pp, vpp, m, r: min(pp - r, m), searched_by_default=True,  # capped at ZB-H1's peak
          build_detailed=build_detailed, summary="ZB-H1 F/B order, W placement solved exactly by MILP")
def build(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Order:
    order = build_detailed(pp, vpp, num_microbatches, costs).order
    return _ops(order) if is_arrays(order) else order  # type: ignore[arg-type]
