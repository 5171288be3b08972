"""The in-process driver and the comparison: JSON shape, regret arithmetic, exact optimum, plot."""
from __future__ import annotations

import json
import math

import pytest

from searchers.driver import _OPTIMA, compare, exhaustive_optimum, format_table, run_search, trials_to_within
from searchers.testing import SyntheticEvaluator, brute_force_optimum

from .conftest import CAP_BYTES, small_experiment


def test_trials_to_within():
    assert trials_to_within([None, 90.0, 97.0, 98.5, 99.0], 100.0) == 4
    assert trials_to_within([None, 50.0], 100.0) is None
    assert trials_to_within([], 100.0) is None


def test_run_search_reports_what_happened(small, tmp_path):
    res = run_search(small, "seed_llm", 20, 0, tmp_path / "l.parquet", evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    d = res.to_dict()
    assert 12 < d["trials"] <= 20 and d["searcher"] == "seed_llm"
    assert d["proposer"] == "seed-planner + cross-axis (offline)"  # no breakdowns: the round-based proposer
    assert len(d["best_so_far"]) == d["trials"] and d["best_so_far"][-1] == d["best_tokens_per_s_per_gpu"]
    assert all(a is None or b >= a for a, b in zip(d["best_so_far"], d["best_so_far"][1:]))
    assert d["best_training"]["seq_len"] == 2048 and d["ledger_path"].endswith("l.parquet")
    json.dumps(d, default=str)


def test_compare_shape_and_arithmetic(small, tmp_path):
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    out = compare(small, budget=16, seeds=[0, 1, 2], evaluator=ev, ledger_path=tmp_path / "l.parquet")
    assert set(out) >= {"optimum", "space_size", "searchers"}
    assert set(out["optimum"]) >= {"tokens_per_s_per_gpu", "config"}
    best, point = brute_force_optimum(small.space, ev)
    assert out["optimum"]["tokens_per_s_per_gpu"] == pytest.approx(best)
    assert out["space_size"] == small.space.size
    assert set(out["searchers"]) == {"seed_llm", "tpe", "gp", "random", "grid"}
    for name, s in out["searchers"].items():
        assert set(s) >= {"median_best", "median_regret", "regrets", "median_trials_to_2pct",
                          "prefilter_rejections", "proposer"}
        assert len(s["regrets"]) == 3
        for b, r in zip(s["bests"], s["regrets"]):
            assert r == pytest.approx(1 - b / best) and 0.0 <= r < 1.0
        assert s["median_regret"] == pytest.approx(sorted(s["regrets"])[1])
    assert out["searchers"]["seed_llm"]["proposer"] == "seed-planner + cross-axis (offline)"
    assert set(out["curves"]) == set(out["searchers"])  # what raytune_primus.plots.compare_curves draws
    for name, runs in out["curves"].items():
        assert len(runs) == 3 and [r[-1] for r in runs] == out["searchers"][name]["bests"]
    text = format_table(out)
    assert "seed_llm" in text and "median regret" in text
    json.dumps(out, default=str)


class _BoundedSynthetic(SyntheticEvaluator):
    """Pretends ILP is expensive and offers a loose provable bound for it."""

    def __init__(self):
        super().__init__(cap_bytes=CAP_BYTES)
        self.ilp_scored = 0

    def upper_bound(self, run):
        if run.training.schedule != "ilp":
            return None
        return super().score(run).tokens_per_s_per_gpu * 1.02

    def score(self, run):
        self.ilp_scored += run.training.schedule == "ilp"
        return super().score(run)


def test_exhaustive_optimum_prunes_expensive_schedules_and_stays_exact():
    exp = small_experiment(pp_schedule=["1f1b", "ilp"], pp=[2])
    _OPTIMA.clear()
    ev = _BoundedSynthetic()
    out = exhaustive_optimum(exp.space, ev)
    _OPTIMA.clear()
    plain = exhaustive_optimum(exp.space, SyntheticEvaluator(cap_bytes=CAP_BYTES))
    _OPTIMA.clear()
    best, _ = brute_force_optimum(exp.space, SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert out["tokens_per_s_per_gpu"] == plain["tokens_per_s_per_gpu"] == pytest.approx(best)
    ilp_points = sum(1 for p in exp.space.iter_points() if p.get("pp_schedule") == "ilp")
    assert 0 < ev.ilp_scored < ilp_points


def test_offline_proposer_beats_the_baselines_on_the_small_space():
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    out = compare(small_experiment(), budget=20, seeds=3, evaluator=ev, searchers=["seed_llm", "random"])
    s = out["searchers"]
    assert s["seed_llm"]["median_regret"] <= 0.02
    assert s["seed_llm"]["median_regret"] <= s["random"]["median_regret"]
    assert not math.isnan(s["random"]["median_best"])
