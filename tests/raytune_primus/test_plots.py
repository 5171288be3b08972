"""Every figure of raytune_primus.plots draws from the project's own result objects and their JSON."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.offset import MeasuredRun, fit_offset
from oracle.pipeline import StageCosts, run_schedule
from oracle.projector import pipeline_result, project
from raytune_primus import plots as P
from tests.conftest import ROOT

CONFIG = ROOT / "tests" / "fixtures" / "configs" / "llama70b-h100.yaml"


@pytest.fixture(scope="module")
def llama():
    run = RunConfig.load(CONFIG)
    return run, project(run)


def _png(path):
    from PIL import Image
    assert path.stat().st_size > 5_000
    with Image.open(path) as im:
        return im.size


def test_gantt_of_a_schedule(tmp_path):
    res = run_schedule("zbv", 4, 2, 8, StageCosts.uniform(pp=4, vpp=2, f_s=1.0, b_s=1.0, w_s=1.0, p2p_s=0.02))
    w, h = _png(P.gantt(res, tmp_path / "zbv.png"))
    assert w > h  # one row per rank, time along x


def test_projection_figures_from_objects_and_from_json(llama, tmp_path):
    run, proj = llama
    assert _png(P.memory_stages(proj.memory, tmp_path / "m.png"))
    assert _png(P.memory_stages(proj.to_dict()["memory"], tmp_path / "m_json.png"))  # a summary.json winner
    assert _png(P.time_breakdown(proj.breakdown, tmp_path / "t.png", iteration_time_s=proj.iteration_time_s))
    assert _png(P.time_breakdown(proj.to_dict()["breakdown_s"], tmp_path / "t_json.png"))
    assert _png(P.gantt(pipeline_result(run), tmp_path / "g.png"))


def test_time_terms_keep_exposed_and_hidden_apart(llama):
    _, proj = llama
    terms, exposed = P._time_terms(proj.to_dict()["breakdown_s"])
    by = {t[0]: t for t in terms}
    for c in proj.breakdown.comm:
        if c.total_s > 0:
            assert by[f"comm {c.kind}"][1:] == pytest.approx((c.exposed_s, c.total_s - c.exposed_s))
    # the exposed terms are the critical path: they add up to the iteration (within the simulator's rounding)
    assert exposed == pytest.approx(proj.iteration_time_s, rel=0.02)


def test_stage_buckets_agree_between_object_and_json(llama):
    _, proj = llama
    obj, cap, worst = P._stage_buckets(proj.memory)
    js, cap_js, worst_js = P._stage_buckets(proj.to_dict()["memory"])
    assert cap == pytest.approx(cap_js) and worst == worst_js
    worst_obj = dict(obj)[worst]
    assert {k: pytest.approx(v) for k, v in worst_obj.items()} == dict(js)[worst]


def _rows(n=12):
    rows = []
    for i in range(n):
        status = "rejected" if i % 4 == 3 else "ok"
        rows.append({"status": status, "searcher": "tpe" if i % 2 else "random", "memory_gib": 40.0 + 5 * i,
                     "cap_gib": 70.0, "tokens_per_s_per_gpu": None if status != "ok" else 1000.0 + 37 * (i % 5),
                     "config_key": f"k{i}", "config": json.dumps({"tp": 1 + i % 2})})
    rows.append({"status": "illegal", "searcher": "tpe", "memory_gib": None, "cap_gib": None,
                 "tokens_per_s_per_gpu": None, "config_key": None, "reason": "tp=3 does not divide 64 heads"})
    return rows


def test_trial_figures(tmp_path):
    rows = _rows()
    assert _png(P.throughput_memory(rows, tmp_path / "tm.png", winner_key="k4"))
    assert _png(P.prefilter(rows, tmp_path / "pf.png"))
    assert _png(P.best_so_far({"tpe": [None, 10.0, 12.0, 12.0], "random": [5.0, 5.0, 9.0]}, tmp_path / "b.png"))


def test_compare_curves_from_a_compare_summary(tmp_path):
    summary = {"experiment": "x", "budget": 4, "seeds": [0, 1], "oracle_mode": "synthetic",
               "optimum": {"tokens_per_s_per_gpu": 100.0},
               "searchers": {"seed_llm": {"proposer": "seed-planner"}, "tpe": {"proposer": "tpe"}},
               "curves": {"seed_llm": [[50.0, 90.0, 99.0], [None, 70.0, 80.0, 100.0]], "tpe": [[10.0], [20.0, 30.0]]}}
    assert _png(P.compare_curves(summary, tmp_path / "c.png"))


def test_validation_and_calibration_scatter(tmp_path):
    from oracle.validate import read_rows, validate_rows
    csv = ROOT / "benchmarks" / "holdout" / "published-holdout.csv"
    results = validate_rows(read_rows(csv), base_dir=csv.parent)
    assert _png(P.validation_scatter(results, tmp_path / "v.png"))
    runs = [MeasuredRun(tag=f"r{i}", projected_tokens_per_s_per_gpu=p, measured_tokens_per_s_per_gpu=m)
            for i, (p, m) in enumerate([(4957, 4213), (4620, 4059), (4095, 3709)])]
    assert _png(P.calibration_scatter(runs, fit_offset(runs), tmp_path / "cal.png"))


points = st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 1e5, allow_nan=False)),
                  min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(points)
def test_pareto_front_is_exactly_the_undominated_points(pts):
    front = set(P.pareto_front(pts))

    def dominated(i):
        return any((b[0] <= pts[i][0] and b[1] >= pts[i][1]) and (b[0] < pts[i][0] or b[1] > pts[i][1])
                   for b in pts)
    for i in range(len(pts)):
        if dominated(i):
            assert i not in front
    # every undominated (memory, throughput) value is represented once
    assert {pts[i] for i in front} == {p for i, p in enumerate(pts) if not dominated(i)}
    mems = [pts[i][0] for i in P.pareto_front(pts)]
    assert mems == sorted(mems)
