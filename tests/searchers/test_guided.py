"""The breakdown-guided proposer (searchers.guided), the step model it ranks with (searchers.stepmodel), and
seed_llm's choice of offline proposer."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from oracle.errors import InvalidConfigError
from searchers import driver
from searchers.crossaxis import LABEL as ROUNDS_LABEL
from searchers.evaluator import score_result
from searchers.experiment import EXPERIMENT_DIR, load_experiment
from searchers.guided import LABEL as GUIDED_LABEL
from searchers.seed_llm import OFFLINE, SeedThenPropose
from searchers.stepmodel import StepModel

SEARCHERS_DIR = Path(driver.__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_oracle():
    return load_experiment("tiny-moe-h100-8"), driver.OracleEvaluator("simulate")


def test_step_model_reproduces_the_point_it_was_calibrated_on(tiny_oracle):
    exp, ev = tiny_oracle
    sp = exp.space
    model = StepModel(sp)
    assert not model.ready
    base = sp.baseline
    res = score_result(ev, base, base.key())
    model.observe(sp.point_of(base), res.breakdown)
    assert model.ready
    at = model.encode(sp.point_of(base))[None, :]
    assert model.times(at)[0] == pytest.approx(res.iteration_time_s, rel=1e-9)  # one point: exactly its own time
    other, _ = sp.validate({**sp.point_of(base), "mbs": 2})
    more = score_result(ev, other, other.key())
    model.observe(sp.point_of(other), more.breakdown)
    # two points: the compute elasticities are fitted (ridge), so each is reproduced closely, not exactly
    assert model.times(at)[0] == pytest.approx(res.iteration_time_s, rel=0.02)
    assert model.times(model.encode(sp.point_of(other))[None, :])[0] == pytest.approx(more.iteration_time_s, rel=0.02)
    # every point of the space gets a finite, positive prediction
    t = model.times(sp._index_array)
    assert t.shape == (sp.size,) and np.all(np.isfinite(t)) and np.all(t > 0)


def test_guided_is_the_default_offline_proposer_and_is_deterministic(tiny_oracle):
    exp, ev = tiny_oracle
    a = driver.run_search(exp, "seed_llm", 12, 0, evaluator=ev)
    b = driver.run_search(exp, "seed_llm", 12, 3, evaluator=ev)
    assert a.proposer == f"seed-planner + {GUIDED_LABEL}"
    assert a.proposer_trials.get(GUIDED_LABEL, 0) > 0
    assert a.best_so_far == b.best_so_far and a.best_key == b.best_key  # the seed changes nothing offline
    assert a.prefilter_rejections == 0  # every guided candidate was probed to fit first


def test_guided_beats_or_ties_the_round_based_proposer_on_a_small_budget(tiny_oracle):
    exp, ev = tiny_oracle
    guided = driver.run_search(exp, "seed_llm", 12, 0, evaluator=ev)
    rounds = driver.run_search(exp, "seed_llm", 12, 0, evaluator=ev, options={"offline": "rounds"})
    assert rounds.proposer == f"seed-planner + {ROUNDS_LABEL}"
    assert guided.best_tokens_per_s_per_gpu >= rounds.best_tokens_per_s_per_gpu


def test_without_breakdowns_the_seed_plan_and_the_round_based_proposer_run(small, synthetic):
    res = driver.run_search(small, "seed_llm", 20, 0, evaluator=synthetic)
    assert res.proposer == f"seed-planner + {ROUNDS_LABEL}"
    assert res.proposer_trials.get("seed-planner", 0) > 1


def test_an_llm_that_cannot_answer_falls_back_to_the_guided_proposer(tiny_oracle, monkeypatch):
    monkeypatch.delenv("PRIMUS_NO_SUCH_KEY", raising=False)
    exp, ev = tiny_oracle
    llm = {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "PRIMUS_NO_SUCH_KEY"}
    res = driver.run_search(exp, "seed_llm", 16, 0, evaluator=ev, options={"llm": llm})
    assert res.proposer.endswith(f"-> {GUIDED_LABEL} fallback")
    assert res.trials == 16 and res.proposer_trials.get(GUIDED_LABEL, 0) > 0


def test_unknown_offline_proposer_is_one_line(small):
    with pytest.raises(InvalidConfigError, match=r"offline='nope' .*valid: " + ", ".join(OFFLINE)):
        SeedThenPropose(small.space, offline="nope")


def _names_known_to_the_project() -> set[str]:
    from oracle.model_card import bundled_models
    names = {p.stem for p in EXPERIMENT_DIR.glob("*.yaml")} | {p.stem for p in EXPERIMENT_DIR.glob("*/*.yaml")}
    names |= set(bundled_models())
    return {n.lower() for n in names if len(n) > 3}


@pytest.mark.parametrize("module", ["seed_llm", "seed", "guided", "stepmodel", "crossaxis", "history", "llm", "prefilter"])
def test_no_experiment_or_model_name_in_the_searcher(module):
    text = (SEARCHERS_DIR / f"{module}.py").read_text().lower()
    found = sorted(n for n in _names_known_to_the_project() if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text))
    assert not found, f"searchers/{module}.py names {found}"
