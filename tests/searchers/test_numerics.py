"""Numerics are the user's: precision, the FP8 recipe, FP8 activations and token dropping stay as given unless
the space opens them (``allow`` or an explicit ``restrict``); every registered searcher keeps to that."""
from __future__ import annotations

import json

import pytest

from oracle.errors import InvalidConfigError
from searchers.base import available
from searchers.driver import run_search
from searchers.experiment import Experiment, load_experiment
from searchers.ledger import read_rows
from searchers.space import NUMERICS_AXES, SearchSpace
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES, small_experiment

BUDGET = 12


def _held(precision: str, allow: tuple[str, ...] = ()) -> Experiment:
    """The small tiny-moe space with the user's precision and no precision list of its own."""
    exp = small_experiment()
    restrict = {k: v for k, v in exp.restrict.items() if k != "precision"}
    return exp.with_changes(baseline=exp.baseline.with_training(precision=precision), restrict=restrict,
                            allow=allow)


def _precisions(path) -> set[str]:
    return {json.loads(r["config"])["precision"] for r in read_rows(path) if r["config"]}


def test_a_default_space_holds_every_numerics_axis(tiny):
    sp = SearchSpace(tiny.baseline.with_training(precision="fp8"))
    assert not set(NUMERICS_AXES) & set(sp.axes)
    assert sp.values["precision"] == ("fp8",)
    assert sp.numerics() == {"open": [], "baseline": {a: getattr(sp.baseline.training, a) for a in NUMERICS_AXES}}


def test_allow_opens_a_group_with_the_hardware_defaults(tiny):
    sp = SearchSpace(tiny.baseline, allow=("precision", "token_drop"))  # H100: FP8, no FP4, no MXFP8
    assert sp.values["precision"] == ("bf16", "fp8")
    assert sp.values["fp8_recipe"] == ("delayed", "tensorwise", "blockwise")
    assert sp.values["moe_expert_capacity_factor"] == (None, 1.0)
    assert sp.numerics()["open"] == ["precision", "fp8_recipe", "moe_expert_capacity_factor",
                                     "moe_pad_expert_input_to_capacity"]
    for p in sp.iter_points():  # legality prunes the combinations that mean nothing
        assert p["fp8_recipe"] == "delayed" or p["precision"] == "fp8"
        assert not p["moe_pad_expert_input_to_capacity"] or p["moe_expert_capacity_factor"] is not None
    b200 = load_experiment("qwen3-30b-a3b-b200-8").baseline
    assert SearchSpace(b200, allow=("precision",)).values["precision"] == ("bf16", "fp8", "nvfp4")
    dense = load_experiment("llama3.1-70b-h100-64").baseline
    assert "moe_expert_capacity_factor" not in SearchSpace(dense, allow=("token_drop",)).axes  # nothing to drop


def test_an_unknown_group_is_a_one_line_error(tiny):
    with pytest.raises(InvalidConfigError) as e:
        SearchSpace(tiny.baseline, allow=("precison",))
    assert e.value.problems == ["space.allow: unknown group 'precison'; valid: precision, fp8_activations, "
                                "token_drop, optimizer, mtp, software"]


def test_numerics_says_what_a_point_changes(small):
    sp = small.space  # the small space lists precision explicitly: open
    assert sp.numerics({"precision": "fp8", "tp": 2})["changed"] == {"precision": "fp8"}
    assert sp.numerics({"tp": 2})["changed"] == {}
    assert sp.numerics()["open"] == ["precision"]


@pytest.mark.parametrize("searcher", available())
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_no_registered_searcher_changes_a_precision_the_user_gave(searcher, precision, tmp_path):
    path = tmp_path / "ledger.parquet"
    res = run_search(_held(precision), searcher, BUDGET, 0, path, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert res.trials > 0
    assert _precisions(path) == {precision}  # every candidate, scored, rejected or illegal
    assert res.best_training is None or res.best_training["precision"] == precision


def test_the_same_search_changes_it_once_allowed(tmp_path):
    # the guard above can fail: with the group open the searchers do move the format
    moved = set()
    for searcher in available():
        path = tmp_path / f"{searcher}.parquet"
        run_search(_held("bf16", allow=("precision",)), searcher, BUDGET, 0, path,
                   evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
        if _precisions(path) != {"bf16"}:
            moved.add(searcher)
    assert "seed_llm" in moved and len(moved) >= 3, moved


@pytest.mark.llm
def test_an_llm_asking_for_another_precision_gets_an_illegal_row(tmp_path):
    from dspy.utils import DummyLM

    def plan(configs):
        return {"reasoning": "fp8 is faster", "rationale": "switch to fp8", "hypotheses": ["fp8 helps"],
                "candidate_configs": json.dumps(configs), "polish_plan": "none"}

    def step(tool, **args):
        return {"next_thought": f"call {tool}", "next_tool_name": tool, "next_tool_args": args}

    finish = [step("finish"), {"reasoning": "done", "best_config": "{}", "summary": "-", "next_steps": "none"}]
    answers = [plan([{"precision": "fp8", "mbs": 2}]), step("evaluate", config={"precision": "fp8", "mbs": 2}),
               *finish, plan("not json ["), *finish]
    path = tmp_path / "ledger.parquet"
    run_search(_held("bf16"), "seed_llm", 20, 0, path, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES),
               options={"lm": DummyLM(answers)})
    rows = read_rows(path)
    assert [r["status"] for r in rows if "precision=fp8 is outside the search space" in r["reason"]] == ["illegal"]
    assert {json.loads(r["config"])["precision"] for r in rows if r["status"] in ("ok", "rejected")} == {"bf16"}
