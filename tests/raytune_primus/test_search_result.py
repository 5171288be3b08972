"""One result type for a search, whichever driver ran it: summary.json has the same keys by --driver."""
from __future__ import annotations

import dataclasses
import json

import pytest

from raytune_primus.jobs import tune_experiment
from raytune_primus.tuner import TuneRecord
from searchers.driver import SearchResult
from searchers.testing import SyntheticEvaluator


def test_summary_json_has_the_same_keys_whichever_driver(small, tmp_path):
    s_in = tune_experiment(small, tmp_path, driver="inprocess", searcher="random", budget=3, seed=0,
                           evaluator=SyntheticEvaluator(), progress=False)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["driver"] == "inprocess" and on_disk["tune"] is None and on_disk["ray"] is None
    # what the Ray driver returns is the same type; only its own record is filled in
    r = SearchResult(experiment="x", searcher="random", seed=0, proposer="random", budget=3, trials=3, resumed=0,
                     best_tokens_per_s_per_gpu=1.0, best_training={"tp": 1}, best_key="k", best_memory_gib=1.0,
                     best_so_far=[1.0], prefilter_rejections=0, illegal=0, failed=0, repeats=0,
                     oracle_mode="synthetic", ledger_path=None, wall_s=0.1, driver="ray",
                     tune=TuneRecord(tune_trials=3, errored=1, retries=2, experiment_path="p", restored=False,
                                     max_concurrent=1))
    s_ray = r.summary()
    added = {"ray", "ledger", "wall_s", "ok", "summary", "experiment_file", "numerics", "software"}  # by tune_experiment
    assert set(s_ray) <= set(s_in) and set(s_in) - set(s_ray) == {*added, *(k for k in s_in if k in ("report", "plots"))}
    assert (s_ray["tune_trials"], s_ray["errored"], s_ray["retries"]) == (3, 1, 2)
    assert s_ray["tune"]["experiment_path"] == "p"


def test_search_result_is_immutable():
    r = SearchResult(experiment="x", searcher="random", seed=0, proposer="random", budget=1, trials=0, resumed=0,
                     best_tokens_per_s_per_gpu=None, best_training=None, best_key="", best_memory_gib=None,
                     best_so_far=[], prefilter_rejections=0, illegal=0, failed=0, repeats=0,
                     oracle_mode="synthetic", ledger_path=None, wall_s=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.trials = 5  # type: ignore[misc]
    assert r.winner is None and r.summary()["winner"] is None
