"""The Tune path: same sequence as the in-process driver, budget under concurrency, retries, errors."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.raytune_primus.conftest import SmallCapEvaluator

pytestmark = pytest.mark.ray

COMPARED = ("trial_index", "status", "config_key", "tokens_per_s_per_gpu", "memory_gib", "cap_gib", "phase",
            "round", "proposer", "note", "reason", "config")


def _rows(path: Path) -> list[dict]:
    from searchers.ledger import read_rows
    return [{k: r[k] for k in COMPARED} for r in read_rows(path)]


def _counted(path: Path) -> list[dict]:
    return [r for r in _rows(path) if r["trial_index"] >= 0]


class KillOnce:
    """Trial hook: the ``nth`` trial to start kills its own process, once (picklable, state in files)."""

    def __init__(self, folder: Path, nth: int = 3) -> None:
        self.folder, self.nth = Path(folder), nth

    def __call__(self, config) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"start-{uuid.uuid4().hex}").touch()
        started = len(list(self.folder.glob("start-*")))
        if started == self.nth and not (self.folder / "killed").exists():
            (self.folder / "killed").touch()
            os._exit(1)


def always_fail(config) -> None:
    raise RuntimeError("injected trial failure")


def test_tune_proposes_scores_and_records_what_the_inprocess_driver_does(cluster, small, tmp_path):
    from raytune_primus.tuner import run_tune
    from searchers.driver import run_search

    ev = SmallCapEvaluator()
    # a baseline over the cap (1.66 GiB without recompute): seed_llm skips moves its memory probe says do not
    # fit, but the baseline itself is always tried, so both drivers must record at least that rejection
    small = small.with_changes(baseline=small.baseline.with_training(recompute="none"))
    ref = run_search(small, "seed_llm", 14, 0, tmp_path / "inproc.parquet", evaluator=ev)
    env = {k: os.environ.get(k) for k in ("TUNE_GLOBAL_CHECKPOINT_S", "RAY_AIR_NEW_OUTPUT")}
    out = run_tune(small, tmp_path / "ray", searcher="seed_llm", budget=14, seed=0, evaluator=ev, progress=False)
    assert {k: os.environ.get(k) for k in env} == env, "run_tune put the environment back"
    assert type(out) is type(ref) and (out.driver, ref.driver) == ("ray", "inprocess")
    assert out.trials == ref.trials == 14
    assert out.prefilter_rejections == ref.prefilter_rejections > 0
    assert out.best_so_far == ref.best_so_far
    assert out.winner == ref.winner and out.winner["tokens_per_s_per_gpu"] == ref.best_tokens_per_s_per_gpu
    assert _rows(tmp_path / "ray" / "ledger.parquet") == _rows(tmp_path / "inproc.parquet")
    # the summary has the same keys and, but for the driver's own record, the same values
    s_ray, s_in = out.summary(), ref.summary()
    assert s_ray.keys() == s_in.keys()
    differ = {k for k in s_ray if s_ray[k] != s_in[k]}
    assert differ <= {"driver", "tune", "tune_trials", "search_wall_s", "proposer_stats"}, differ
    # pre-filter rejections never became Tune trials; everything else did, once
    assert out.tune.tune_trials == out.trials - out.prefilter_rejections
    assert out.tune.errored == 0 and out.tune.retries == 0 and ref.tune is None


def test_concurrent_trials_spend_exactly_the_budget_and_agree_with_tune(cluster, small, tmp_path):
    from ray.tune import ExperimentAnalysis

    from raytune_primus.tuner import run_tune

    out = run_tune(small, tmp_path, searcher="random", budget=10, seed=3, evaluator=SmallCapEvaluator(),
                   max_concurrent=3, progress=True)
    counted = _counted(tmp_path / "ledger.parquet")
    assert len(counted) == out.trials == 10
    assert sorted(r["trial_index"] for r in counted) == list(range(10))
    assert len({r["config_key"] for r in counted}) == 10, "no configuration scored twice"
    ea = ExperimentAnalysis(out.tune.experiment_path)
    tune_keys = sorted(t.last_result["config_key"] for t in ea.trials)
    ledger_keys = sorted(r["config_key"] for r in counted if r["status"] != "rejected")
    assert tune_keys == ledger_keys
    assert out.tune.scorers["max_busy"] <= 3
    assert out.tune.progress and "rejected by pre-filter" in out.tune.progress[-1]
    assert out.tune.progress[-1].startswith("[10/10]")


def test_a_crashed_trial_is_retried_and_the_retry_recorded(cluster, small, tmp_path):
    from raytune_primus.tuner import run_tune

    no_rejections = SmallCapEvaluator(cap_bytes=64 * 2**30)  # every trial reaches Tune, so a 2nd one starts
    out = run_tune(small, tmp_path / "run", searcher="random", budget=4, seed=1, evaluator=no_rejections,
                   max_failures=2, hook=KillOnce(tmp_path / "marks", nth=2), progress=False)
    assert (tmp_path / "marks" / "killed").exists()
    assert out.tune.retries == 1 and out.tune.errored == 0
    rows = _rows(tmp_path / "run" / "ledger.parquet")
    retried = [r for r in rows if r["status"] == "retried"]
    assert len(retried) == 1 and retried[0]["trial_index"] == -1
    counted = [r for r in rows if r["trial_index"] >= 0]
    assert len(counted) == 4 and not any(r["status"] == "failed" for r in counted)


def test_all_trials_erroring_is_a_failure_not_a_success(cluster, small, tmp_path, monkeypatch):
    from raytune_primus import jobs

    s = jobs.tune_experiment(small, tmp_path, budget=2, searcher="random", evaluator=SmallCapEvaluator(),
                             max_failures=0, hook=always_fail, progress=False, address="auto")
    assert s["ok"] is False
    assert s["errored"] == s["tune_trials"] >= 1
    assert s["failed"] == s["tune_trials"]
    assert s["winner"] is None
    assert (tmp_path / "summary.json").exists() and (tmp_path / "ledger.parquet").exists()
    # the job entry point turns that into a non-zero exit status
    monkeypatch.setattr(jobs, "tune_experiment", lambda *a, **k: s)
    monkeypatch.setattr("searchers.experiment.load_experiment", lambda name: small)
    assert jobs.main(["tiny", "--results", str(tmp_path), "--quiet"]) == jobs.EXIT_ALL_ERRORED
