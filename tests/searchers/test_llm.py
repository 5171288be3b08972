"""The LLM proposer, offline: DSPy's DummyLM with scripted answers, and a local OpenAI-compatible
server (good answers, a timeout, an auth error). The API key never reaches logs or the ledger."""
from __future__ import annotations

import json
import logging

import pytest

from searchers.driver import run_search
from searchers.ledger import read_rows
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES
from .fake_openai import FakeOpenAI, chat_reply

pytestmark = pytest.mark.llm
KEY = "sk-test-DO-NOT-LEAK-8f3a2c"


def _plan(configs):
    return {"reasoning": "seed shows fp8 and mbs help", "rationale": "combine fp8 with tp2",
            "hypotheses": ["fp8 helps", "tp2 relieves memory"],
            "candidate_configs": configs if isinstance(configs, str) else json.dumps(configs),
            "polish_plan": "vary mbs around the winner"}


def _step(tool, **args):
    return {"next_thought": f"call {tool}", "next_tool_name": tool, "next_tool_args": args}


FINISH = [_step("finish"), {"reasoning": "done", "best_config": "{}", "summary": "fp8 wins", "next_steps": "none"}]


def _run(small, tmp_path, lm=None, llm=None, budget=20):
    path = tmp_path / "ledger.parquet"
    opts = {"lm": lm} if lm is not None else {"llm": llm}
    res = run_search(small, "seed_llm", budget, 0, path, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES),
                     options=opts)
    return res, read_rows(path), path


def test_dummy_lm_good_malformed_and_illegal_proposals(small, tmp_path):
    from dspy.utils import DummyLM
    answers = [_plan([{"precision": "fp8", "tp": 2}, {"tp": 3}]),
               _step("get_legal_axes"), _step("read_scratchpad"), _step("get_history", k=5),
               _step("evaluate", config={"precision": "fp8", "tp": 2, "mbs": 2}),     # good
               _step("evaluate", config={"tp": 3}),                                  # illegal axis value
               _step("evaluate", config={"tpp": 2}),                                 # unknown axis
               _step("evaluate", config="tp two please"),                            # no JSON at all
               _step("evaluate_memory_only", config={"mbs": 2}),
               _step("note_to_scratchpad", text="fp8 + tp2 is strong"),
               _step("get_best"), _step("get_budget_status"), _step("get_architecture"), _step("get_cluster"),
               *FINISH,
               # round 2: the planner answers malformed JSON, the executor stops at once
               _plan("not json at all ["), *FINISH]
    res, rows, _ = _run(small, tmp_path, lm=DummyLM(answers))
    assert res.proposer.startswith("seed-planner + llm:")
    llm_rows = [r for r in rows if r["phase"] == "llm"]
    statuses = [r["status"] for r in llm_rows]
    assert statuses[:4] == ["ok", "illegal", "illegal", "llm_malformed"]
    ill = [r for r in llm_rows if r["status"] == "illegal"]
    assert any("tp=3 is outside the search space" in r["reason"] for r in ill)
    assert any("unknown key 'tpp'" in r["reason"] for r in ill)
    assert all(r["legal"] is False and r["trial_index"] == -1 for r in ill)
    assert sum(r["status"] == "llm_malformed" for r in rows) >= 2     # the bad evaluate() and the bad plan
    assert res.proposer_stats["proposals"] >= 3 and res.proposer_stats["illegal"] == 2
    assert res.trials <= 20 and res.best_tokens_per_s_per_gpu is not None


def test_dummy_lm_failing_rounds_fall_back_to_the_offline_proposer(small, tmp_path):
    from dspy.utils import DummyLM
    res, rows, _ = _run(small, tmp_path, lm=DummyLM([]))     # every call fails to parse
    assert "cross-axis (offline) fallback" in res.proposer
    assert [r["status"] for r in rows if r["phase"] == "llm"][:3] == ["llm_malformed", "llm_malformed",
                                                                        "llm_fallback"]
    assert any(r["phase"] == "cross-axis" for r in rows)
    assert res.trials > 12


def _scripted_server_answers():
    plans = iter([_plan([{"precision": "fp8", "mbs": 2}])])
    steps = iter([_step("evaluate", config=json.dumps({"precision": "fp8", "mbs": 2})),
                  _step("evaluate", config={"precision": "fp8", "tp": 2}),
                  _step("finish")])

    def script(kind, body):
        if kind == "plan":
            p = next(plans, None)
            return chat_reply(**p) if p else "no plan"
        if kind == "step":
            s = next(steps, None)
            return chat_reply(**s) if s else chat_reply(**_step("finish"))
        if kind == "extract":
            return chat_reply(reasoning="ok", best_config="{}", summary="s", next_steps="n")
        return chat_reply()
    return script


def test_local_server_through_litellm_key_from_env_never_logged(small, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PRIMUS_TEST_LLM_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI(_scripted_server_answers()) as srv:
        llm = {"model": "openai/test-model", "api_base": srv.url, "api_key_env": "PRIMUS_TEST_LLM_KEY",
               "timeout_s": 20, "max_tokens": 2000, "engine": "litellm"}
        res, rows, path = _run(small, tmp_path, llm=llm)
    assert res.proposer.startswith("seed-planner + llm:openai/test-model")
    assert srv.requests and all(h.get("Authorization", h.get("authorization")) == f"Bearer {KEY}"
                                for _, h, _ in srv.requests)
    ok = [r for r in rows if r["phase"] == "llm" and r["status"] in ("ok", "rejected")]
    assert ok and json.loads(ok[0]["config"])["precision"] == "fp8"
    assert KEY not in caplog.text
    assert KEY.encode() not in path.read_bytes()


def test_a_keyless_server_on_this_machine_is_called_without_api_key_env(small, tmp_path, monkeypatch):
    # llama.cpp / vLLM / Ollama take no key, but LiteLLM's OpenAI client refused to call without one ('Missing
    # credentials'): a loopback api_base without api_key_env gets a placeholder, never the environment's key
    from searchers.llm import LOCAL_NO_KEY, is_loopback
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAI(_scripted_server_answers()) as srv:
        llm = {"model": "openai/local-model", "api_base": srv.url, "timeout_s": 20, "max_tokens": 2000}
        res, rows, _ = _run(small, tmp_path, llm=llm)
    assert res.proposer.startswith("seed-planner + llm:openai/local-model")
    assert srv.requests and all(h.get("Authorization", h.get("authorization")) == f"Bearer {LOCAL_NO_KEY}"
                                for _, h, _ in srv.requests)
    assert any(r["phase"] == "llm" and r["status"] in ("ok", "rejected") for r in rows)
    # a key the environment holds for the provider (a local gateway's, in OPENAI_API_KEY) is not replaced
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAI(_scripted_server_answers()) as srv:
        _run(small, tmp_path / "with-env-key", llm={**llm, "api_base": srv.url})
    assert srv.requests and all(h.get("Authorization", h.get("authorization")) == f"Bearer {KEY}"
                                for _, h, _ in srv.requests)
    assert [is_loopback(u) for u in ("http://127.0.0.1:8080/v1", "localhost:11434", "http://[::1]:8000/v1",
                                     "https://api.openai.com/v1", "http://10.1.2.3:8000", "http://[::1", None)] == [
        True, True, True, False, False, False, False]


def test_local_server_timeout_is_counted_and_the_search_goes_on(small, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PRIMUS_TEST_LLM_KEY", KEY)
    with FakeOpenAI(delay_s=3.0) as srv:
        llm = {"model": "openai/slow", "api_base": srv.url, "api_key_env": "PRIMUS_TEST_LLM_KEY",
               "timeout_s": 0.5, "engine": "auto"}
        res, rows, path = _run(small, tmp_path, llm=llm)
    timeouts = [r for r in rows if r["status"] == "llm_timeout"]
    assert len(timeouts) == 2 and all("planner" in r["reason"] for r in timeouts)
    assert "cross-axis (offline) fallback" in res.proposer
    assert res.trials > 12 and any(r["phase"] == "cross-axis" for r in rows)
    assert KEY not in caplog.text and KEY.encode() not in path.read_bytes()


def test_endpoint_error_echoing_the_key_is_scrubbed(small, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PRIMUS_TEST_LLM_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI(status=401, error=f"Incorrect API key provided: {KEY}") as srv:
        llm = {"model": "openai/x", "api_base": srv.url, "api_key_env": "PRIMUS_TEST_LLM_KEY", "engine": "auto"}
        res, rows, path = _run(small, tmp_path, llm=llm)
    errs = [r for r in rows if r["status"] == "llm_endpoint_error"]
    assert errs and "Incorrect API key provided: ***" in errs[0]["reason"]
    assert KEY not in caplog.text and KEY.encode() not in path.read_bytes()
    assert res.trials > 12 and any(r["phase"] == "cross-axis" for r in rows)


def test_missing_key_variable_falls_back_without_crashing(small, tmp_path, monkeypatch):
    monkeypatch.delenv("PRIMUS_NO_SUCH_KEY", raising=False)
    llm = {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "PRIMUS_NO_SUCH_KEY"}
    res, rows, _ = _run(small, tmp_path, llm=llm)
    assert "fallback" in res.proposer
    assert any("PRIMUS_NO_SUCH_KEY" in (r["reason"] or "") and "not set" in r["reason"] for r in rows)


def test_without_an_llm_the_offline_proposer_runs_and_says_so(small, tmp_path):
    res = run_search(small, "seed_llm", 20, 0, evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert res.proposer == "seed-planner + cross-axis (offline)"


def test_building_the_lm_leaves_the_environment_as_it_was(monkeypatch):
    import os

    from searchers.llm import LLMSettings
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    LLMSettings(model="openai/test-model", api_base="http://127.0.0.1:9").build_lm()
    assert "LITELLM_LOCAL_MODEL_COST_MAP" not in os.environ


def test_the_offline_fallback_keeps_the_search_context(small):
    """The fallback proposer gets the driver's SearchContext like the offline proposer does (its free
    memory probes and layout jumps need it)."""
    from searchers.history import History
    from searchers.llm import LLMProposer

    class Context:
        def budget_status(self):
            return {"remaining": 7}

        def event(self, *_args, **_kw):
            pass

    ctx = Context()
    prop = LLMProposer(small.space, History(small.space), lm=object(), context=ctx)
    prop._switch_to_fallback("test")
    assert prop._fallback.context is ctx and prop._fallback.control.rounds == 7


def test_litellm_is_imported_without_fetching_its_cost_map_and_the_environment_is_put_back():
    """The first import of dspy/LiteLLM (searchers.llm._dspy, which every import in the module uses) runs with
    LiteLLM's own fetches off, in a fresh interpreter whose environment does not set them: LiteLLM loads its bundled
    cost map without trying GitHub (it did when dspy imported LiteLLM lazily, at the first LM call), and neither
    variable is left set."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_OFFLINE_MODE")}
    code = ("import os, searchers.llm as L; L._dspy(); "
            "from litellm.litellm_core_utils.get_model_cost_map import _cost_map_source_info as i; "
            "print(i.source, i.is_env_forced, os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'), "
            "os.environ.get('LITELLM_OFFLINE_MODE'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["local", "True", "None", "None"], out.stdout + out.stderr[-2000:]
    assert "fetch" not in out.stderr
