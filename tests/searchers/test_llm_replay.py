"""The LLM proposer against real small-model output: answers recorded from Qwen2.5-Coder 0.5B/1.5B
(tests/fixtures/llm, taken from ../shared/llm-recordings) replayed through the local fake
OpenAI-compatible server. The junk they wrote (legal axes copied into candidate_configs, ``[{}, {}, {}]``,
``evaluate({"config": {"axis": [...]}})``, echoed observation blocks, bullet-list hypotheses) must
not shorten the search: the whole budget is spent, the offline proposer finishing what the LLM
leaves, and the summary and the ledger say which proposer produced each trial."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytune_primus.jobs import tune_experiment
from searchers.ledger import read_rows
from searchers.llm import CHARS_PER_TOKEN, PROMPT_TOKENS, _signatures, parse_candidates, parse_list
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES
from .fake_openai import FakeOpenAI, replay

pytestmark = pytest.mark.llm
RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "llm" / "qwen-recorded-answers.json").read_text())
KEY = "sk-replay-DO-NOT-LEAK-41c9"


def _tune(exp, answers, results, evaluator):
    """``tune`` (in-process driver), budget 30, the LLM answering from ``answers`` through the fake server."""
    with pytest.MonkeyPatch.context() as mp, FakeOpenAI(replay(answers)) as srv:
        mp.setenv("PRIMUS_REPLAY_KEY", KEY)
        mp.setenv("DSPY_CACHEDIR", str(results / "dspy-cache"))
        llm = {"model": "openai/qwen2.5-coder-0.5b-instruct", "api_base": srv.url, "api_key_env": "PRIMUS_REPLAY_KEY",
               "timeout_s": 30, "max_tokens": 800, "engine": "litellm"}
        summary = tune_experiment(exp.with_changes(searcher="seed_llm", llm=llm, budget=30), results,
                                  driver="inprocess", evaluator=evaluator, progress=False)
    return summary, read_rows(results / "ledger.parquet"), srv, results


@pytest.fixture(scope="module")
def replayed(tiny, tmp_path_factory):
    """The tiny experiment with the 0.5B model's whole recorded run (plans, tool steps, extracts)."""
    return _tune(tiny, RECORDED["answers"], tmp_path_factory.mktemp("replay"), SyntheticEvaluator(cap_bytes=CAP_BYTES))


def test_recorded_junk_spends_the_whole_budget_and_the_summary_says_who_proposed(replayed):
    summary, rows, srv, results = replayed
    assert srv.requests, "the LLM was never asked"
    # the whole budget is spent and the summary says so, per proposer
    assert summary["trials_run"] == 30 and summary["budget_spent"] is True
    by = summary["proposer_trials"]
    assert sum(by.values()) == 30
    assert by.get("seed-planner", 0) >= 1 and by.get("cross-axis (offline)", 0) >= 1
    assert "cross-axis (offline) fallback" in summary["proposer"]
    on_disk = json.loads((results / "summary.json").read_text())
    assert on_disk["proposer_trials"] == by and on_disk["budget_spent"] is True
    # the ledger names the proposer of every counted trial, and agrees with the summary
    counted = [r for r in rows if r["trial_index"] >= 0]
    assert len(counted) == 30 and all(r["proposer"] for r in counted)
    assert {p: sum(r["proposer"] == p for r in counted) for p in by} == by
    # the junk was recorded as such, the rounds that scored nothing failed, then the fallback took over
    statuses = [r["status"] for r in rows]
    assert "llm_fallback" in statuses
    fallback = next(r for r in rows if r["status"] == "llm_fallback")
    assert "scored no trial" in fallback["reason"] or "rounds are over" in fallback["reason"]
    junk = [r["reason"] for r in rows if r["status"] == "llm_malformed"]
    assert any("each axis takes one value" in j or "empty object" in j for j in junk), junk
    # nothing the model wrote reached the oracle as a configuration it did not name
    llm_counted = [r for r in counted if r["phase"] == "llm"]
    assert all(r["config"] for r in llm_counted)
    assert summary["proposer_stats"]["failed_rounds"] >= 2
    assert KEY.encode() not in (results / "ledger.parquet").read_bytes()
    assert KEY not in (results / "summary.json").read_text()


def test_every_prompt_fits_the_documented_token_budget(replayed):
    _, _, srv, _ = replayed
    sizes = [sum(len(m.get("content") or "") for m in body["messages"]) for _, _, body in srv.requests]
    assert sizes and max(sizes) / CHARS_PER_TOKEN <= PROMPT_TOKENS, max(sizes)


def test_the_1_5b_planner_answer_with_bullet_hypotheses_is_read():
    import dspy
    plan_signature, _ = _signatures()
    sig = dspy.ChainOfThought(plan_signature).predict.signature
    fields = dspy.ChatAdapter().parse(sig, RECORDED["planner_1_5b"]["content"])
    hypotheses = parse_list(fields["hypotheses"])
    assert len(hypotheses) == 4 and hypotheses[0].startswith("**Increase Memory Per-GPU**")
    candidates, junk = parse_candidates(fields["candidate_configs"], 25)
    assert junk == [] and len(candidates) == 4
    assert candidates[0] == {"tp": 2, "cp": 1, "pp": 4, "vpp": 1, "pp_schedule": "interleaved", "ep": 8, "mbs": 4,
                             "recompute": "none", "precision": "bf16"}


@pytest.mark.parametrize("text, expected, dropped", [
    ('```json\n[{"tp": 2}, {"mbs": 4}]\n```', [{"tp": 2}, {"mbs": 4}], 0),
    ('- {"tp": 2}\n- {"mbs": 4}', [{"tp": 2}, {"mbs": 4}], 0),
    ("[{'tp': 2, 'fsdp': True}]", [{"tp": 2, "fsdp": True}], 0),
    ('Here you go: [{"tp": 2}, {"mbs": 4', [{"tp": 2}, {"mbs": 4}], 0),
    ('[{"config": {"tp": 2}}, {"candidate": {"config": {"mbs": 4}}}]', [{"tp": 2}, {"mbs": 4}], 0),
    ('{"candidates": [{"tp": 2}, {"tp": 2}]}', [{"tp": 2}], 0),
    ('{"tp": 4}', [{"tp": 4}], 0),
    ("[{}, {}, {}]", [], 3),
    ('[{"axes": {"tp": [1, 2, 4, 8], "pp": [1, 2]}, "fixed": {"gbs": 512}}]', [], 1),
    ('[{"tp": [1, 2, 4, 8]}, {"pp": 2}]', [{"pp": 2}], 1),
])
def test_candidates_are_read_leniently_and_junk_is_dropped(text, expected, dropped):
    got, junk = parse_candidates(text, 25)
    assert got == expected and len(junk) == dropped


def test_no_json_at_all_is_an_error_naming_the_text():
    with pytest.raises(ValueError, match="no JSON object or list in 'I think tp should be 2'"):
        parse_candidates("I think tp should be 2", 25)


@pytest.mark.parametrize("text, expected", [
    ('["a", "b"]', ["a", "b"]),
    ("- a\n- b\n\n", ["a", "b"]),
    ("1. a\n2) b\n* c", ["a", "b", "c"]),
    (["a", " "], ["a"]),
])
def test_lists_are_read_from_json_or_bullets(text, expected):
    assert parse_list(text) == expected


def test_the_1_5b_planners_candidates_are_evaluated_when_its_executor_writes_junk(tmp_path):
    """The bundled Mixtral experiment: the 1.5B model's plan (bullet hypotheses, fenced JSON candidates), then
    the 0.5B model's junk tool steps. The planner's candidates reach the pre-filter directly; the rounds score
    nothing (illegal or over memory), so the offline proposer spends the rest of the budget."""
    from searchers.experiment import load_experiment
    answers = [{"kind": "plan", "content": RECORDED["planner_1_5b"]["content"]}] + [
        a for a in RECORDED["answers"] if a["kind"] != "plan"]
    summary, rows, _, _ = _tune(load_experiment("mixtral-8x22b-mi355x-4node"), answers, tmp_path / "results",
                                SyntheticEvaluator())
    direct = [r for r in rows if r["note"] == "planner (executor scored none)"]
    assert {r["status"] for r in direct} >= {"illegal"} and any(r["trial_index"] >= 0 for r in direct)
    assert any("needs vpp >= 2" in (r["reason"] or "") for r in direct)  # the plan's {"vpp": 1, "interleaved"}
    assert not any("hypotheses" in (r["reason"] or "") for r in rows)    # bullets are no longer a parse error
    by = summary["proposer_trials"]
    assert by["llm:openai/qwen2.5-coder-0.5b-instruct"] >= 1 and sum(by.values()) == 30
    assert summary["budget_spent"] is True


def test_prompts_fit_the_budget_with_a_long_history_plan_and_trajectory():
    """A 4k-token context holds every call however much the search has to tell: 60 trials with long
    reasons, a long scratchpad and guidance, a long plan with 25 candidates, a 30-step trajectory."""
    import dspy

    from searchers.base import Candidate, TrialResult
    from searchers.experiment import load_experiment
    from searchers.history import History
    from searchers.llm import LLMProposer, prompt_chars

    space = load_experiment("mixtral-8x22b-mi355x-4node").space
    history = History(space)
    for i, point in enumerate(space.points[:60]):
        run = space.run_of(point)
        history.add(Candidate(values=dict(zip(space.axes, point)), phase="seed"),
                    TrialResult(status="ok", key=run.key(), training=run.to_dict()["training"],
                                tokens_per_s_per_gpu=1000.0 + i, peak_bytes=2e11, cap_bytes=2.5e11,
                                reason="a long reason " * 12))
    prop = LLMProposer(space, history, lm=object(), extra_guidance="guidance " * 400)
    prop.scratchpad = ["a note that goes on " * 20] * 30
    budget_chars = PROMPT_TOKENS * CHARS_PER_TOKEN
    plan_signature, search_signature = _signatures()
    sig = dspy.ChainOfThought(plan_signature).predict.signature
    inputs = prop._plan_inputs(sig)
    assert prompt_chars(sig, inputs) <= budget_chars
    assert len(json.loads(inputs["history_summary"])) >= 5   # the best trials still make it in
    planned = [dict(zip(space.axes, p)) for p in space.points[100:125]]
    executor, ex_inputs = prop._executor(search_signature, "a long plan " * 500, planned)
    steps = {}
    for i in range(30):
        steps.update({f"thought_{i}": "thinking " * 30, f"tool_name_{i}": "evaluate",
                      f"tool_args_{i}": {"config": planned[i % 25]}, f"observation_{i}": "observed " * 40})
    trajectory = executor._format_trajectory(steps)
    assert "observation_29" in trajectory and "observation_0" not in trajectory  # the latest steps are kept
    for signature in (executor.react.signature, executor.extract.predict.signature):
        assert prompt_chars(signature, {**ex_inputs, "trajectory": trajectory}) <= budget_chars


def test_a_list_of_names_is_one_value_for_a_key_that_takes_one():
    from searchers.llm import LIST_AXES, unwrap_proposal
    assert {"cuda_graph_scope", "recompute_modules", "offload_modules"} <= LIST_AXES
    assert unwrap_proposal({"cuda_graph_scope": ["attn", "moe_router"], "tp": 2}) == (
        {"cuda_graph_scope": ["attn", "moe_router"], "tp": 2}, "")
    for junk in ({"tp": [1, 2, 4]}, {"cuda_graph_scope": [["attn"], ["mlp"]]}, {"recompute": {"a": 1}}):
        values, why = unwrap_proposal(junk)
        assert values is None and "each axis takes one value" in why
