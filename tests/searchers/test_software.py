"""``allow: [software]``: the search may change how a step runs (the MoE dispatcher and its overlaps, fused kernels,
CUDA graphs, FP8 weight gathers), and every registered searcher searches such a space (tuple-valued settings
included)."""
from __future__ import annotations

import json

import pytest

from oracle.legality import check
from searchers.base import available
from searchers.driver import run_search
from searchers.evaluator import OracleEvaluator
from searchers.ledger import read_rows
from searchers.space import SOFTWARE

from .conftest import small_experiment


def _software_space():
    """The small tiny-moe space (a few dozen points) with the software group open: a few hundred."""
    return small_experiment().with_changes(allow=("software",))


def test_the_small_space_grows_by_the_software_settings():
    exp = _software_space()
    opened = set(exp.space.axes) - set(small_experiment().space.axes)
    assert opened == {"moe_a2a_overlap", "moe_router_fusion", "cuda_graph_impl", "cuda_graph_scope",
                      "fp8_param_gather"} and opened <= set(SOFTWARE)
    assert exp.space.size > 4 * small_experiment().space.size


def test_seed_llm_searches_the_software_settings_on_the_oracle(tmp_path):
    exp = _software_space()
    budget = 16
    res = run_search(exp, "seed_llm", budget, 0, tmp_path / "l.parquet", evaluator=OracleEvaluator("simulate"))
    assert res.trials == budget and res.budget_spent and res.illegal == 0  # the guided phase carries on past the seed
    configs = [json.loads(r["config"]) for r in read_rows(tmp_path / "l.parquet") if r["config"]]
    base = exp.space.baseline.training
    moved = {k for c in configs for k in SOFTWARE if k in exp.space.axes
             and c[k] != (list(v) if isinstance(v := getattr(base, k), tuple) else v)}
    assert {"moe_router_fusion", "moe_a2a_overlap"} <= moved  # the seed planner's software moves were measured
    assert res.best_tokens_per_s_per_gpu >= res.best_so_far[0]


@pytest.mark.parametrize("name", sorted(set(available()) - {"seed_llm"}))
def test_every_searcher_proposes_legal_points_of_the_software_space(name, tmp_path):
    exp = _software_space()
    res = run_search(exp, name, 6, 1, tmp_path / "l.parquet", evaluator=OracleEvaluator("simulate"))
    assert res.trials == 6 and res.failed == 0
    for r in read_rows(tmp_path / "l.parquet"):
        if r["config"]:
            run = exp.space.make(exp.space.point_of(json.loads(r["config"])))
            assert not check(run)


def test_the_space_says_which_software_settings_it_searches_and_which_more_it_could():
    closed, opened = small_experiment().space.software(), _software_space().space.software()
    assert closed["open"] == [] and set(closed["more"]) == {"moe_a2a_overlap", "moe_router_fusion", "cuda_graph_impl",
                                                             "cuda_graph_scope", "fp8_param_gather"}
    assert set(opened["open"]) == set(closed["more"]) and opened["more"] == []
