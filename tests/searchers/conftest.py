"""Fixtures for the searcher tests: small spaces on the tiny-moe card and a synthetic oracle."""
from __future__ import annotations

import os

import pytest

from searchers.experiment import Experiment, load_experiment
from searchers.testing import SyntheticEvaluator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

# Narrow restrictions on top of the bundled tiny experiment: a few dozen legal points.
SMALL = {"tp": [1, 2], "pp": [1, 2], "vpp": [1, 2], "ep": [1, 2], "mbs": [1, 2],
         "pp_schedule": ["1f1b", "interleaved"], "recompute": ["none", "full"], "precision": ["bf16", "fp8"]}
SMALL_PINS = {"cp": 1, "fsdp": False, "use_distributed_optimizer": True, "moe_a2a_backend": "alltoall"}
# Memory cap for the synthetic oracle: only about a third of the tiny space fits under it.
CAP_BYTES = 1.56 * 2**30


def small_experiment(**restrict_changes) -> Experiment:
    base = load_experiment("tiny-moe-h100-8")
    restrict = {**SMALL, **restrict_changes}
    return base.with_changes(name="tiny-small", restrict=restrict, pins=dict(SMALL_PINS))


@pytest.fixture(scope="session")
def tiny() -> Experiment:
    """The bundled tiny experiment (a few hundred legal points)."""
    return load_experiment("tiny-moe-h100-8")


@pytest.fixture(scope="session")
def small() -> Experiment:
    """A few dozen legal points: exhaustible by every searcher in a test."""
    return small_experiment()


@pytest.fixture
def synthetic() -> SyntheticEvaluator:
    return SyntheticEvaluator(cap_bytes=CAP_BYTES)


@pytest.fixture(autouse=True)
def _dspy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "dspy-cache"))
