"""The memory pre-filter: over-cap candidates are never scored, are told back as infeasible,
count as trials, and are written to the ledger with the reason."""
from __future__ import annotations

import pytest

from searchers.base import Candidate, Searcher, TrialResult
from searchers.book import TrialBook
from searchers.driver import run_search
from searchers.ledger import Ledger, read_rows
from searchers.prefilter import PreFilter
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES


class _List(Searcher):
    def __init__(self, space, points):
        super().__init__(space)
        self.points = list(points)
        self.told: list[tuple[Candidate, TrialResult]] = []

    def suggest(self):
        return Candidate(values=self.points.pop(0), phase="list") if self.points else None

    def observe(self, candidate, result):
        self.told.append((candidate, result))


def _split(space, ev):
    fit, over = [], []
    for p in space.iter_points():
        (fit if ev.memory(space.run_of(p)).fits else over).append(p)
    return fit, over


def test_over_cap_is_rejected_before_scoring_and_told_back(small, tmp_path):
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    fit, over = _split(small.space, ev)
    assert fit and over
    inner = _List(small.space, [over[0], over[1], fit[0]])
    ledger = Ledger(tmp_path / "l.parquet")
    book = TrialBook(budget=10, run_id="r", searcher="list", seed=0, oracle_mode=ev.mode, ledger=ledger)
    gate = PreFilter(inner, ev, book)
    ev.score_calls = 0
    c = gate.suggest()
    assert c.values == fit[0] and "run" in c.meta
    assert ev.score_calls == 0                      # nothing scored yet
    assert [r.status for _, r in inner.told] == ["rejected", "rejected"]
    r = inner.told[0][1]
    assert r.fits is False and r.value is None and r.memory_ratio > 1
    assert "memory pre-filter: peak" in r.reason and "> cap" in r.reason
    assert book.used == 2 and gate.stats()["prefilter_rejections"] == 2
    rows = read_rows(tmp_path / "l.parquet")
    assert [x["status"] for x in rows] == ["rejected", "rejected"]
    assert all(x["fits"] is False and x["legal"] is True and x["memory_gib"] > x["cap_gib"] for x in rows)
    assert [x["trial_index"] for x in rows] == [0, 1]


def test_rejections_count_against_the_budget(small):
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    fit, over = _split(small.space, ev)
    inner = _List(small.space, over[:5] + fit[:5])
    book = TrialBook(budget=3, run_id="r", searcher="list", seed=0, oracle_mode=ev.mode)
    gate = PreFilter(inner, ev, book)
    ev.score_calls = 0
    assert gate.suggest() is None and book.used == 3 and ev.score_calls == 0


def test_repeats_are_free_and_answered_from_the_book(small):
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    fit, over = _split(small.space, ev)
    inner = _List(small.space, [over[0], over[0], fit[0]])
    book = TrialBook(budget=10, run_id="r", searcher="list", seed=0, oracle_mode=ev.mode)
    gate = PreFilter(inner, ev, book)
    ev.memory_calls = 0
    gate.suggest()
    assert book.used == 1 and gate.repeats == 1 and ev.memory_calls == 2
    assert inner.told[1][1] is inner.told[0][1]


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_optuna_sees_rejections_as_constraint_violations(name, small):
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    res = run_search(small, name, 12, 0, evaluator=ev)
    assert res.prefilter_rejections > 0
    # rerun by hand to look inside the study
    from searchers.base import make_searcher
    s = make_searcher(name, small.space, seed=0)
    book = TrialBook(budget=12, run_id="r", searcher=name, seed=0, oracle_mode=ev.mode)
    gate = PreFilter(s, ev, book)
    from searchers.evaluator import score_result
    while (c := gate.suggest()) is not None:
        res = score_result(ev, c.meta["run"], c.meta["key"])
        book.record(c, res)
        gate.observe(c, res)
    trials = s.study.get_trials(deepcopy=False)
    infeasible = [t for t in trials if t.constraints and t.constraints["memory"] > 0]
    feasible = [t for t in trials if t.constraints and t.constraints["memory"] <= 0]
    assert len(infeasible) >= book.count("rejected") > 0 and feasible


def test_a_rejected_baseline_still_lets_the_search_go_on(small, tmp_path):
    ev = SyntheticEvaluator(cap_bytes=ev_cap_below_baseline(small))
    res = run_search(small, "seed_llm", 12, 0, tmp_path / "l.parquet", evaluator=ev)
    rows = read_rows(tmp_path / "l.parquet")
    assert rows[0]["status"] == "rejected" and rows[0]["note"] == "baseline"
    assert res.prefilter_rejections >= 1


def ev_cap_below_baseline(exp):
    return SyntheticEvaluator().memory(exp.space.baseline).peak_bytes * 0.999
