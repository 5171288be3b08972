"""The one place raytune_primus reaches into Ray Tune's internals, checked against the installed Ray.

``Tuner.restore`` offers no public accessor for the search algorithm and callbacks it unpickles, and a
resumed search needs both (the searcher holds the trial book; the progress bar its lines). If a Ray
upgrade moves them, this test fails first, with the Ray version in the message.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ray import tune
from ray.tune.search import ConcurrencyLimiter, Searcher

from raytune_primus.tuner import SUPPORTED_RAY, restored_search_and_callbacks


class _Fixed(Searcher):
    def suggest(self, trial_id):
        return {"x": 1}

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def test_the_restored_tuner_accessor_finds_what_was_put_in(tmp_path):
    search = ConcurrencyLimiter(_Fixed(metric="m", mode="max"), max_concurrent=1)
    callback = tune.Callback()
    tuner = tune.Tuner(lambda config: {"m": 1.0},
                       tune_config=tune.TuneConfig(search_alg=search, num_samples=1),
                       run_config=tune.RunConfig(name="t", storage_path=str(tmp_path), callbacks=[callback]))
    got_search, got_callbacks = restored_search_and_callbacks(tuner)
    assert got_search is search and got_search.searcher is search.searcher
    assert callback in got_callbacks


def test_a_moved_attribute_is_a_loud_error_naming_the_ray_version():
    with pytest.raises(RuntimeError, match=rf"Ray {re.escape(ray.__version__)} keeps a restored Tuner"):
        restored_search_and_callbacks(object())


def test_the_installed_ray_is_in_the_supported_and_pinned_range():
    assert Version(ray.__version__) in SpecifierSet(SUPPORTED_RAY), (ray.__version__, SUPPORTED_RAY)
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"ray[default,tune]{SUPPORTED_RAY}"' in pyproject


def test_the_tune_environment_is_put_back(monkeypatch):
    import os

    from raytune_primus.tuner import _environment
    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S", raising=False)
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "1")
    with _environment({"TUNE_GLOBAL_CHECKPOINT_S": "0", "RAY_AIR_NEW_OUTPUT": "0"}):
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "0" and os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
    assert "TUNE_GLOBAL_CHECKPOINT_S" not in os.environ and os.environ["RAY_AIR_NEW_OUTPUT"] == "1"
