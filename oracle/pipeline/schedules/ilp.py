"""ilp: optimal weight-gradient (W) placement on the ZB-H1 skeleton, solved as a MILP (vpp=1).

What is fixed and what is optimised:
- Each rank's F/B order is ZB-H1's (1F1B warm-up ``pp - r - 1``, then F/B alternation). The W's are
  placed freely, subject to W(j) after B(j) on its rank, and to a memory cap (default: the peak of
  ``zero_bubble`` under the same costs, so ZB-H1 itself is feasible and ilp <= zero_bubble always).
- With vpp=1 every W of a rank costs the same and nothing depends on a W, so W identities do not
  matter: W's run FIFO and the decision is only *how many* W's follow each F/B op.

Formulation (exact, no big-M): integer ``n[r,k] >= 0`` = W's right after the k-th F/B op of rank r,
continuous start times ``t[r,k]`` and the makespan T; minimise T subject to
  sequence   t[r,k+1] >= t[r,k] + d[r,k] + w_r * n[r,k]
  data       t[op] >= t[dep] + d[dep] + p2p(boundary)            (F down, B up the pipeline)
  makespan   T >= t[r,last] + d[r,last] + w_r * n[r,last]
  count      sum_k n[r,k] = m;   W after its B: sum_{k'<=k} n[r,k'] <= #B in ops 0..k
  memory     after each F: a_r * (#F - frac * #B_before - (1 - frac) * #W_before) <= cap.
For fixed n the smallest feasible times are exactly the simulator's (both are the longest-path
max-plus recursion), so the MILP optimum IS the optimal simulated makespan over all W placements.

Work budget (:class:`IlpBudget`), independent of the clock so the same configuration gets the same
schedule on any machine, busy or idle: problems with more than ``max_ops`` F/B ops are not attempted,
and HiGHS (scipy.optimize.milp, serial and deterministic) stops after ``node_limit`` branch-and-bound
nodes. A wall-clock cap stays only as a safety net; when it is hit the note says so (that one result
then depends on machine speed). When the optimum is not proven, the best known order (the solver's
incumbent or ZB-H1's placement, whichever simulates faster) is returned with ``approximate=True`` and
the reason in the note. Results are cached per (pp, m, costs, budget).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from oracle.pipeline.schedules import Built, Order, register
from oracle.pipeline.schedules.one_f_one_b import fb_sequence
from oracle.pipeline.schedules.zero_bubble import zb_h1_rank
from oracle.pipeline.types import Op, StageCosts

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


DEFAULT_BUDGET = IlpBudget(max_ops=4096, node_limit=10_000, safety_time_limit_s=600.0)
"""Single projections: every bundled size solves to proven optimality well inside it."""
SEARCH_BUDGET = IlpBudget(max_ops=1024, node_limit=200, safety_time_limit_s=120.0)
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


def _order_from_counts(fb: list[list[Op]], counts: list[list[int]]) -> Order:
    order: Order = []
    for ops, cnt in zip(fb, counts):
        out: list[Op] = []
        next_w = 0
        for op, k in zip(ops, cnt):
            out.append(op)
            for _ in range(k):
                out.append(Op("W", next_w, 0))
                next_w += 1
        order.append(out)
    return order


def solve_w_placement(pp: int, num_microbatches: int, costs: StageCosts, *, mem_cap_bytes: float | None = None,
                      budget: IlpBudget = DEFAULT_BUDGET) -> WPlacement:
    """Optimal W placement on the ZB-H1 F/B skeleton (see the module docstring)."""
    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import coo_matrix

    from oracle.pipeline.simulator import simulate

    m = num_microbatches
    zb = [zb_h1_rank(pp, r, m) for r in range(pp)]
    zb_res = simulate(zb, pp, 1, "interleaved", m, costs)
    cap = max(zb_res.peak_activation_bytes) if mem_cap_bytes is None else float(mem_cap_bytes)
    fb = [fb_sequence(pp, r, m, backward="B") for r in range(pp)]
    n_ops = sum(len(ops) for ops in fb)
    if n_ops > budget.max_ops:
        return WPlacement(zb, zb_res.makespan_s, False,
                          f"{n_ops} F/B ops > the ILP budget's max_ops={budget.max_ops}: MILP not attempted, "
                          f"ZB-H1 placement used")

    offset = []
    pos = {}
    for r, ops in enumerate(fb):
        offset.append(sum(len(x) for x in fb[:r]))
        for k, op in enumerate(ops):
            pos[(op.kind, op.mb, r)] = offset[r] + k
    n_var = 2 * n_ops + 1
    t_idx = lambda r, k: offset[r] + k  # noqa: E731
    n_idx = lambda r, k: n_ops + offset[r] + k  # noqa: E731
    T = 2 * n_ops
    lat = costs.boundary_p2p_s()
    frac = costs.b_release_fraction
    rows, cols, vals, lo, hi = [], [], [], [], []
    row = 0

    def add(coefs: list[tuple[int, float]], lb: float, ub: float) -> None:
        nonlocal row
        for j, a in coefs:
            rows.append(row); cols.append(j); vals.append(a)
        lo.append(lb); hi.append(ub)
        row += 1

    for r, ops in enumerate(fb):
        w = costs.w_s[r][0]
        a = costs.act_bytes[r][0]
        d = [costs.f_s[r][0] if op.kind == "F" else costs.b_s[r][0] for op in ops]
        n_b = 0
        n_f = 0
        for k, op in enumerate(ops):
            if k + 1 < len(ops):
                add([(t_idx(r, k + 1), 1.0), (t_idx(r, k), -1.0), (n_idx(r, k), -w)], d[k], np.inf)
            else:
                add([(T, 1.0), (t_idx(r, k), -1.0), (n_idx(r, k), -w)], d[k], np.inf)
            if op.kind == "F" and r > 0:
                j = pos[("F", op.mb, r - 1)]
                add([(t_idx(r, k), 1.0), (j, -1.0)], costs.f_s[r - 1][0] + lat[r - 1], np.inf)
            if op.kind == "B" and r < pp - 1:
                j = pos[("B", op.mb, r + 1)]
                add([(t_idx(r, k), 1.0), (j, -1.0)], costs.b_s[r + 1][0] + lat[r], np.inf)
            if op.kind == "F":
                n_f += 1
                # memory after this F: a*(n_f - frac*n_b - (1-frac)*W_before) <= cap
                need = n_f - frac * n_b - cap / a if a > 0 else -1.0
                if need > 1e-12:
                    if frac >= 1.0:
                        return WPlacement(zb, zb_res.makespan_s, False, "memory cap infeasible; ZB-H1 used")
                    add([(n_idx(r, kk), 1.0) for kk in range(k)], need / (1.0 - frac), np.inf)
            else:
                n_b += 1
            add([(n_idx(r, kk), 1.0) for kk in range(k + 1)], -np.inf, n_b)
        add([(n_idx(r, kk), 1.0) for kk in range(len(ops))], m, m)

    A = coo_matrix((vals, (rows, cols)), shape=(row, n_var)).tocsr()
    c = np.zeros(n_var)
    c[T] = 1.0
    integrality = np.zeros(n_var)
    integrality[n_ops:2 * n_ops] = 1
    ub = np.full(n_var, np.inf)
    ub[n_ops:2 * n_ops] = m
    from scipy.optimize import Bounds
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(np.zeros(n_var), ub),
               options={"node_limit": budget.node_limit, "time_limit": budget.safety_time_limit_s,
                        "mip_rel_gap": MIP_REL_GAP})
    # status 1 = iteration/time limit: within the node budget it can only be the wall-clock cap
    capped = res.status == 1 and (res.mip_node_count is None or res.mip_node_count < budget.node_limit)
    cap_note = (f"; the {budget.safety_time_limit_s:g} s safety time cap stopped the solver, so this order "
                f"depends on machine speed" if capped else "")
    if res.x is None:
        return WPlacement(zb, zb_res.makespan_s, False, f"MILP found no solution ({res.message}); ZB-H1 used"
                          + cap_note, capped)
    counts = []
    for r, ops in enumerate(fb):
        counts.append([int(round(res.x[n_idx(r, k)])) for k in range(len(ops))])
    order = _order_from_counts(fb, counts)
    span = simulate(order, pp, 1, "interleaved", m, costs).makespan_s
    optimal = res.status == 0
    if not optimal:
        if zb_res.makespan_s < span:
            order, span = zb, zb_res.makespan_s
        return WPlacement(order, span, False, f"MILP stopped before proving optimality ({res.message}); "
                                              f"best known placement used" + cap_note, capped)
    return WPlacement(order, span, True, f"optimal W placement (MILP, gap <= {MIP_REL_GAP:g}) under a memory "
                                         f"cap of {cap:.4g} bytes")


@contextlib.contextmanager
def work_budget(budget: IlpBudget) -> Iterator[None]:
    """Solve under ``budget`` inside this block (search loops use SEARCH_BUDGET); an unproven optimum
    comes back flagged approximate, as with the default budget."""
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)


@lru_cache(maxsize=256)
def _cached(pp: int, m: int, costs: StageCosts, budget: IlpBudget) -> WPlacement:
    return solve_w_placement(pp, m, costs, budget=budget)


def build_detailed(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Built:
    if costs is None:
        costs = StageCosts.uniform(pp=pp, vpp=1, f_s=1.0, b_s=1.0, w_s=1.0)
    sol = _cached(pp, num_microbatches, costs, _BUDGET.get())
    return Built([list(ops) for ops in sol.order], not sol.optimal, sol.note)


@register("ilp", layout="interleaved", splits_bw=True, vpp_rule="one", cost_aware=True, position=30,
          in_flight=lambda pp, vpp, m, r: min(pp - r, m), searched_by_default=True,  # capped at ZB-H1's peak
          build_detailed=build_detailed, summary="ZB-H1 F/B order, W placement solved exactly by MILP")
def build(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Order:
    return build_detailed(pp, vpp, num_microbatches, costs).order
