"""The CPU scorer (raytune_primus.actors.Scorer) run in-process: what its warm-up leaves loaded."""
from __future__ import annotations

import pytest

from oracle.config import RunConfig
from oracle.pipeline import _jit
from tests.oracle.test_pipeline_jit import jit


def test_a_scorer_loads_the_compiled_replay_at_warm_up_unless_off():
    """A scorer replays in bulk, so its warm-up loads the compiled replay (``_jit.load_now``) instead of leaving
    ``auto`` to switch in the middle of a batch; ``RAYTUNE_PRIMUS_JIT=off`` keeps the Python replay."""
    pytest.importorskip("numba")
    from raytune_primus.actors import Scorer
    from searchers.evaluator import OracleEvaluator
    base = RunConfig.from_dict({"model": "llama3.1-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 2}})
    with jit("auto"):
        Scorer(OracleEvaluator(), base).warm_up()  # in-process here; a Ray actor runs the same method
        assert _jit._state["fn"] is not None
    with jit("off"):
        Scorer(OracleEvaluator(), base).warm_up()
        assert _jit._state["fn"] is None
