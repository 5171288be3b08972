"""The contract every registered searcher honours (run for each name in the registry).

Same seed -> same suggestion sequence (also in a fresh process); finishes when the space is
exhausted; survives illegal and failed trials; its ledger round-trips and a resumed search repeats
no trial.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from searchers.base import Candidate, Searcher, TrialResult, available, make_searcher, register
from searchers.driver import run_search
from searchers.ledger import read_rows
from searchers.prefilter import probe_calls
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES, small_experiment

ROOT = Path(__file__).resolve().parents[2]
NAMES = available()
BUDGET = 12
_SEQUENCES: dict = {}


def keys(exp, name, seed=0, budget=BUDGET, evaluator=None, ledger=None):
    res = run_search(exp, name, budget, seed, ledger, evaluator=evaluator or SyntheticEvaluator(cap_bytes=CAP_BYTES))
    return res, [r["config_key"] for r in read_rows(ledger)] if ledger else None


def _sequence(exp, name, seed, tmp_path, tag):
    path = tmp_path / f"{name}-{tag}.parquet"
    run_search(exp, name, BUDGET, seed, path, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    seq = [(r["status"], r["config_key"]) for r in read_rows(path)]
    _SEQUENCES.setdefault((name, seed), seq)
    return seq


def test_registry_has_the_five_named_searchers():
    assert set(NAMES) >= {"seed_llm", "tpe", "gp", "random", "grid"}


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        @register("random")
        class Again(Searcher):  # noqa: F811
            def suggest(self):
                return None


def test_unknown_searcher_lists_valid_names(small):
    from oracle.errors import UnknownComponentError
    with pytest.raises(UnknownComponentError, match="valid: .*random"):
        make_searcher("nope", small.space)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_sequence(name, small, tmp_path):
    a = _sequence(small, name, 3, tmp_path, "a")
    b = _sequence(small, name, 3, tmp_path, "b")
    assert a == b and len(a) >= 5


def test_same_sequence_in_a_fresh_process(small, tmp_path):
    here = {n: _SEQUENCES.get((n, 3)) or _sequence(small, n, 3, tmp_path, "here") for n in NAMES}
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.searchers.conftest import small_experiment, CAP_BYTES
        from searchers.base import available
        from searchers.driver import run_search
        from searchers.ledger import read_rows
        from searchers.testing import SyntheticEvaluator
        out = {{}}
        for n in available():
            p = {str(tmp_path)!r} + f"/{{n}}-fresh.parquet"
            run_search(small_experiment(), n, {BUDGET}, 3, p, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
            out[n] = [[r["status"], r["config_key"]] for r in read_rows(p)]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                          env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin",
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    for n in NAMES:
        assert [tuple(x) for x in there[n]] == here[n], n


@pytest.mark.parametrize("name", NAMES)
def test_finishes_when_the_space_is_exhausted(name):
    exp = small_experiment(precision=["bf16"], recompute=["full"], tp=[1])
    size = exp.space.size
    assert 4 <= size <= 20
    res = run_search(exp, name, size + 25, 0, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert res.trials <= size  # stopped without exhausting the budget, no configuration twice
    if name in ("random", "tpe"):
        assert res.trials == size  # these reach every point


class _Scripted(Searcher):
    """Proposes an illegal point, then a point whose scoring fails, then legal points."""

    name = "scripted"

    def __init__(self, space, seed=0):
        super().__init__(space, seed=seed)
        self.todo = [{"tp": 3}, {"pp": 2, "mbs": 2}, {"pp": 2, "mbs": 1}]
        self.seen: list[TrialResult] = []

    def suggest(self):
        return Candidate(values=self.todo.pop(0), phase="scripted") if self.todo else None

    def observe(self, candidate, result):
        self.seen.append(result)


@pytest.mark.parametrize("name", NAMES)
def test_survives_illegal_and_failed_trials(name, small, tmp_path):
    # every fifth configuration makes the oracle raise; the search goes on and records it
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES, fail=lambda run: int(run.key(), 16) % 5 == 0)
    path = tmp_path / "l.parquet"
    res = run_search(small, name, BUDGET, 0, path, evaluator=ev)
    rows = read_rows(path)
    assert res.trials == sum(r["trial_index"] >= 0 for r in rows)
    assert res.failed == sum(r["status"] == "failed" for r in rows)
    for r in rows:
        if r["status"] == "failed":
            assert "synthetic failure" in r["reason"]
    # and an illegal observation told directly does not break it
    s = make_searcher(name, small.space, seed=0)
    c = s.suggest()
    s.observe(c, TrialResult(status="illegal", reason="tp=3 is outside the search space"))
    s.suggest()
    s.close()


def test_illegal_and_failed_are_recorded_with_reasons(small, tmp_path, monkeypatch):
    from searchers import base
    monkeypatch.setitem(base._REGISTRY, "scripted", _Scripted)
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES, fail=lambda run: run.training.mbs == 2)
    path = tmp_path / "l.parquet"
    res = run_search(small, "scripted", 10, 0, path, evaluator=ev, options={})
    rows = read_rows(path)
    assert [r["status"] for r in rows] == ["illegal", "failed", rows[2]["status"]]
    assert "tp=3 is outside the search space" in rows[0]["reason"] and rows[0]["legal"] is False
    assert rows[0]["trial_index"] == -1 and rows[1]["trial_index"] == 0
    assert res.illegal == 1 and res.failed == 1 and res.trials == 2


@pytest.mark.parametrize("name", NAMES)
def test_ledger_round_trip_and_resume_without_repeats(name, small, tmp_path):
    path = tmp_path / "ledger.parquet"
    ev = SyntheticEvaluator(cap_bytes=CAP_BYTES)
    first = run_search(small, name, 6, 2, path, evaluator=ev)
    rows1 = read_rows(path)
    assert first.trials == sum(r["trial_index"] >= 0 for r in rows1) <= 6
    for r in rows1:
        if r["status"] == "ok":
            assert r["tokens_per_s_per_gpu"] > 0 and r["fits"] is True and r["memory_gib"] > 0
            assert json.loads(r["config"])["seq_len"] == 2048
            assert r["searcher"] == name and r["oracle_mode"] == "synthetic"
            assert r["finished_at"] >= r["started_at"]
    calls_before = ev.score_calls + ev.memory_calls - probe_calls()
    resumed = run_search(small, name, 12, 2, path, evaluator=ev)
    rows2 = read_rows(path)
    assert rows2[: len(rows1)] == rows1                      # nothing rewritten
    counted = [r["config_key"] for r in rows2 if r["trial_index"] >= 0]
    assert len(counted) == len(set(counted))                 # no configuration scored twice
    assert resumed.resumed == first.trials
    assert resumed.trials == len(counted)
    # the resumed run evaluated only new configurations (free memory probes, memoised per evaluator, are
    # work on configurations that never became trials: counted apart)
    assert ev.score_calls + ev.memory_calls - probe_calls() - calls_before <= 2 * (resumed.trials - first.trials)
    # and it matches an uninterrupted run with the same seed
    straight = tmp_path / "straight.parquet"
    run_search(small, name, 12, 2, straight, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert [r["config_key"] for r in read_rows(straight) if r["trial_index"] >= 0] == counted


def test_optuna_searchers_leave_optunas_global_log_level_alone(small):
    import optuna

    from searchers.base import make_searcher
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    try:
        s = make_searcher("tpe", small.space, seed=0)
        c = s.suggest()
        assert c is not None
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
    finally:
        optuna.logging.set_verbosity(before)
