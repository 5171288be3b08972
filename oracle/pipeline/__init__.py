"""Pipeline schedules + an exact, schedule-agnostic event simulator (pure Python/numpy/scipy).

    run_schedule(name, pp, vpp, num_microbatches, costs)  -> PipelineResult
    compare_schedules(pp, vpp_options, num_microbatches, costs_for) -> list[PipelineResult]
    closed_form_bubble(name, pp, vpp, m)                  -> textbook bubble / ideal compute
    applicable_schedules(pp, vpp[, num_microbatches])     -> names
    simulate(order, pp, vpp, layout, num_microbatches, costs)  (any hand-made order)

Schedules are data (per-rank op lists) built by one module each in ``oracle.pipeline.schedules``;
see docs/pipeline.md for which are exact and which approximate. Builds are cached, so the search
loop pays only for the simulation pass.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from oracle.errors import InvalidConfigError
from oracle.pipeline.schedules import SCHEDULES, ScheduleSpec, get_schedule, is_arrays
from oracle.pipeline.simulator import (CompiledOrder, compile_order, compile_order_arrays, lower_bound_s, run_compiled,
                                       run_compiled_many, simulate)
from oracle.pipeline.types import (Layout, Op, PipelineResult, ScheduleDeadlockError, StageCosts, TimelineEntry,
                                   stage_map, virtual_stage)

__all__ = [
    "Layout", "Op", "StageCosts", "PipelineResult", "TimelineEntry", "ScheduleDeadlockError", "SCHEDULES",
    "virtual_stage", "stage_map", "simulate", "lower_bound_s", "run_schedule", "compare_schedules",
    "closed_form_bubble", "applicable_schedules", "get_schedule", "build_order", "quantized", "run_schedule_many",
]


@lru_cache(maxsize=1024)
def _plan(name: str, pp: int, vpp: int, m: int, costs: StageCosts | None) -> tuple[CompiledOrder, bool, str]:
    spec = get_schedule(name)
    built = spec.make_fast(pp, vpp, m, costs)
    compile_ = compile_order_arrays if is_arrays(built.order) else compile_order
    return compile_(built.order, pp, vpp, spec.layout, m), built.approximate, built.note


def build_order(name: str, pp: int, vpp: int, num_microbatches: int,
                costs: StageCosts | None = None) -> list[list[Op]]:
    """The per-rank op lists of schedule ``name`` (cost-aware schedules use ``costs`` if given)."""
    spec = get_schedule(name)
    plan, _, _ = _plan(name, pp, vpp, num_microbatches, costs if spec.cost_aware else None)
    return [list(ops) for ops in plan.order]


def quantized(costs: StageCosts, steps: int = 32) -> StageCosts:
    """``costs`` rounded to multiples of (largest op cost / steps): similar configurations share one
    cost-aware plan (the ILP / greedy orders), while the simulation still uses the exact costs."""
    top = max(max(max(r) for r in costs.f_s), max(max(r) for r in costs.b_s), max(max(r) for r in costs.w_s))
    if top <= 0:
        return costs
    q = top / steps

    def rnd(m):
        return tuple(tuple(round(x / q) * q for x in row) for row in m)
    p2p = costs.p2p_s if isinstance(costs.p2p_s, float) else tuple(round(x / q) * q for x in costs.p2p_s)
    return StageCosts(f_s=rnd(costs.f_s), b_s=rnd(costs.b_s), w_s=rnd(costs.w_s), act_bytes=costs.act_bytes,
                      p2p_s=p2p, b_release_fraction=costs.b_release_fraction, p2p_blocking=costs.p2p_blocking)


def run_schedule(name: str, pp: int, vpp: int, num_microbatches: int, costs: StageCosts, *,
                 plan_costs: StageCosts | None = None, timeline: bool = True) -> PipelineResult:
    """Build (cached) and simulate schedule ``name``.

    ``plan_costs`` (default ``costs``) are what cost-aware schedules (ilp, the greedy V schedules)
    build their order from; the simulation always replays the order with ``costs``. Passing
    :func:`quantized` costs lets a search reuse one solved order across near-identical configurations;
    the result is then flagged approximate when the two differ.
    Raises UnknownComponentError for an unknown name and InvalidConfigError (a ValueError) when the
    schedule cannot run this (pp, vpp, num_microbatches), e.g. a V schedule with vpp=1.
    ``timeline=False``: no per-op start/end times in the result (see :func:`run_compiled`).
    """
    spec = get_schedule(name)
    spec.check(pp, vpp, num_microbatches)
    basis = plan_costs if plan_costs is not None else costs
    plan, approximate, note = _plan(name, pp, vpp, num_microbatches, basis if spec.cost_aware else None)
    if spec.cost_aware and basis is not costs and basis != costs:
        approximate = True
        note = (note + "; " if note else "") + "order built from quantised costs (search mode), replayed with exact costs"
    return run_compiled(plan, costs, name=name, approximate=approximate, note=note, timeline=timeline)


def run_schedule_many(name: str, pp: int, vpp: int, num_microbatches: int,
                      costs_list: Sequence[StageCosts]) -> list[PipelineResult]:
    """:func:`run_schedule` (``timeline=False``) of a fixed-order schedule for many cost sets: one compiled
    plan, replayed for every configuration at once (``run_compiled_many``: bit-identical results).
    Cost-aware schedules build an order per cost set: call :func:`run_schedule` for those."""
    spec = get_schedule(name)
    if spec.cost_aware:
        raise InvalidConfigError(f"run_schedule_many: {name} builds its order from each cost set; use run_schedule")
    spec.check(pp, vpp, num_microbatches)
    plan, approximate, note = _plan(name, pp, vpp, num_microbatches, None)
    return run_compiled_many(plan, costs_list, name=name, approximate=approximate, note=note)


def _vpp_candidates(spec: ScheduleSpec, vpp_options: Iterable[int]) -> list[int]:
    if spec.vpp_rule == "one":
        return [1]
    if spec.vpp_rule == "two":
        return [2] if 2 in vpp_options else []
    return sorted({v for v in vpp_options if v >= 2})


def applicable_schedules(pp: int, vpp: int, num_microbatches: int | None = None) -> list[str]:
    """Registered schedules that accept (pp, vpp[, num_microbatches]), in registry order."""
    return [name for name, spec in SCHEDULES.items() if not spec.problems(pp, vpp, num_microbatches)]


def compare_schedules(pp: int, vpp_options: Iterable[int], num_microbatches: int,
                      costs_for: Callable[..., StageCosts]) -> list[PipelineResult]:
    """Run every applicable schedule (1f1b first, as the baseline), paper Table 6 style.

    ``costs_for(vpp)`` returns the StageCosts for that chunking; if it also accepts ``layout``, it is
    called as ``costs_for(vpp, layout=...)`` so V-shape costs can put the loss on rank 0. vpp=1
    schedules (1f1b, zero_bubble, ilp) always run; schedules that reject the sizes are skipped.
    """
    options = list(vpp_options)
    try:
        takes_layout = "layout" in inspect.signature(costs_for).parameters
    except (TypeError, ValueError):
        takes_layout = False
    cache: dict[tuple[int, str], StageCosts] = {}
    results = []
    for name, spec in SCHEDULES.items():
        for vpp in _vpp_candidates(spec, options):
            if spec.problems(pp, vpp, num_microbatches):
                continue
            key = (vpp, spec.layout if takes_layout else "")
            if key not in cache:
                cache[key] = costs_for(vpp, layout=spec.layout) if takes_layout else costs_for(vpp)
            results.append(run_schedule(name, pp, vpp, num_microbatches, cache[key]))
    return results


def closed_form_bubble(name: str, pp: int, vpp: int, m: int) -> float | None:
    """Textbook bubble time / ideal compute time; None for schedules without a closed form.

    Assumptions: uniform stages, zero p2p; for split schedules F = B = W per chunk. Validity:
    1f1b: (pp-1)/m for any m >= 1 and any f:b ratio (Narayanan et al. 2021).
    interleaved: (pp-1)/(vpp*m) for m >= pp and any f:b ratio.
    zero_bubble (ZB-H1): (pp-1)/(3m) for m >= pp (bubble (pp-1)(T_F + T_B - T_W); Qi et al. 2023).
    zbv: (pp-1)/(6m) for m >= 2pp-1: only the ramp-up of pp-1 chunk forwards remains (a chunk is half
    a stage, so T_F,chunk = T/2 against an ideal 3mT).
    The simulator reproduces each exactly; the tests check it.
    """
    spec = get_schedule(name)
    spec.check(pp, vpp, m)
    p = pp
    if name == "1f1b":
        return (p - 1) / m
    if name == "interleaved":
        return (p - 1) / (vpp * m)
    if name == "zero_bubble":
        if m < p:
            raise InvalidConfigError(f"the ZB-H1 closed form needs num_microbatches >= pp, got m={m}, pp={p}")
        return (p - 1) / (3 * m)
    if name == "zbv":
        if m < 2 * p - 1:
            raise InvalidConfigError(f"the ZB-V closed form needs num_microbatches >= 2*pp - 1 = {2 * p - 1}, "
                                     f"got m={m}")
        return (p - 1) / (6 * m)
    return None

