"""The ILP schedule is a function of its inputs alone: its work budget counts nodes and ops, not seconds."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from oracle.pipeline.schedules import ilp
from oracle.pipeline.types import StageCosts


def _costs() -> StageCosts:
    # heavier first/last stages (embedding, loss): the MILP needs real work, ~0.1-0.5 s idle
    f = [1.2, 1.0, 1.0, 1.5]
    return StageCosts(f_s=[[x] for x in f], b_s=[[1.1 * x] for x in f], w_s=[[0.8 * x] for x in f],
                      act_bytes=[[1.0]] * 4, p2p_s=0.02)


@contextmanager
def _cpu_load(processes: int = 3) -> Iterator[None]:
    """Busy-loop processes competing for the cores while the block runs."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in busy:
            p.kill()
            p.wait()


def _solve(budget: ilp.IlpBudget) -> ilp.WPlacement:
    ilp._cached.cache_clear()
    with ilp.work_budget(budget):
        built = ilp.build_detailed(4, 1, 32, _costs())
    sol = ilp._cached(4, 32, _costs(), budget)
    assert built.order == [list(ops) for ops in sol.order]
    return sol


def test_same_schedule_idle_and_under_cpu_load():
    idle = _solve(ilp.SEARCH_BUDGET)
    with _cpu_load():
        loaded = _solve(ilp.SEARCH_BUDGET)
    assert not idle.time_capped and not loaded.time_capped
    assert (loaded.order, loaded.makespan_s, loaded.optimal, loaded.note) == (
        idle.order, idle.makespan_s, idle.optimal, idle.note)


def _branching_costs() -> StageCosts:
    # a case neither ZB-H1 nor a rounded LP point settles and whose optimum HiGHS proves only after more
    # than 5 branch-and-bound nodes (found by a seeded search over random costs)
    f, b, w, act = [1.02, 2.21, 2.57], [2.08, 1.98, 1.30], [1.77, 1.12, 1.28], [1.28, 0.93, 1.13]
    return StageCosts(f_s=[[x] for x in f], b_s=[[x] for x in b], w_s=[[x] for x in w],
                      act_bytes=[[x] for x in act], p2p_s=0.2)


def test_a_binding_node_budget_gives_the_same_order_idle_and_under_load():
    # the interesting case: the budget stops the search before the proof, and what it returns must not
    # depend on how fast the machine got through those nodes
    budget = ilp.IlpBudget(max_ops=4096, node_limit=5, safety_time_limit_s=600.0)
    idle = ilp.solve_w_placement(3, 16, _branching_costs(), budget=budget)
    with _cpu_load():
        loaded = ilp.solve_w_placement(3, 16, _branching_costs(), budget=budget)
    assert not idle.optimal and not idle.time_capped and "stopped before proving optimality" in idle.note
    assert (loaded.order, loaded.makespan_s, loaded.optimal, loaded.note, loaded.time_capped) == (
        idle.order, idle.makespan_s, idle.optimal, idle.note, idle.time_capped)
    proven = ilp.solve_w_placement(3, 16, _branching_costs(), budget=ilp.DEFAULT_BUDGET)
    assert proven.optimal and proven.makespan_s <= idle.makespan_s + 1e-9


def test_safety_time_cap_is_reported_not_silent():
    tiny = ilp.IlpBudget(max_ops=4096, node_limit=10_000, safety_time_limit_s=1e-6)
    sol = ilp.solve_w_placement(3, 16, _branching_costs(), budget=tiny)  # a case that reaches the MILP
    assert sol.time_capped and not sol.optimal
    assert "safety time cap" in sol.note and "machine speed" in sol.note


def test_search_mode_uses_the_clock_free_budget(monkeypatch):
    seen: list[ilp.IlpBudget] = []
    real = ilp.solve_w_placement

    def spy(*args, budget, **kwargs):
        seen.append(budget)
        return real(*args, budget=budget, **kwargs)
    monkeypatch.setattr(ilp, "solve_w_placement", spy)
    ilp._cached.cache_clear()
    from oracle.pipeline import quantized, run_schedule
    with ilp.work_budget(ilp.SEARCH_BUDGET):
        run_schedule("ilp", 4, 1, 8, _costs(), plan_costs=quantized(_costs()))
    run_schedule("ilp", 4, 1, 8, _costs())
    assert seen == [ilp.SEARCH_BUDGET, ilp.DEFAULT_BUDGET]
    ilp._cached.cache_clear()
