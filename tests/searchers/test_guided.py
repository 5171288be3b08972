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


def _bubbles(sp, ev, measured: str, scale: float) -> dict[str, float]:
    """Predicted bubble (s) at one pp=2 layout under each schedule, from a model that measured that layout under
    ``measured`` only, its bubble scaled by ``scale``."""
    pts = [p for p in sp.iter_points() if p["pp"] == 2 and p["vpp"] == 1]
    at = next(p for p in pts if p["pp_schedule"] == measured)
    run, _ = sp.validate(at)
    bd = dict(score_result(ev, run, run.key()).breakdown)
    assert bd["bubble_s"] > 0
    bd["bubble_s"] *= scale
    model = StepModel(sp)
    model.observe(at, bd)
    out = {}
    for sched in ("1f1b", "zero_bubble"):
        twin = next(p for p in pts if p["pp_schedule"] == sched and all(
            p[k] == v for k, v in at.items() if k != "pp_schedule"))
        out[sched] = float(model.predict(model.encode(twin)[None, :])["bubble_s"][0])
    return out


def test_a_zero_bubble_schedules_factor_is_not_carried_to_1f1b(tiny_oracle):
    """A zero-bubble schedule's measured bubble says how much of it the deferred weight gradients filled, which 1F1B
    does not do: the 1F1B prediction stays at its prior whatever that measurement; a 1F1B measurement (the stage's
    imbalance) carries to zero-bubble by the ratio of the priors."""
    exp, ev = tiny_oracle
    lo, hi = _bubbles(exp.space, ev, "zero_bubble", 1.0), _bubbles(exp.space, ev, "zero_bubble", 3.0)
    assert hi["zero_bubble"] == pytest.approx(3 * lo["zero_bubble"], rel=1e-9)
    assert hi["1f1b"] == pytest.approx(lo["1f1b"], rel=1e-9), "a zero-bubble factor was carried to 1F1B"
    lo, hi = _bubbles(exp.space, ev, "1f1b", 1.0), _bubbles(exp.space, ev, "1f1b", 2.0)
    assert hi["1f1b"] == pytest.approx(2 * lo["1f1b"], rel=1e-9)
    assert hi["zero_bubble"] == pytest.approx(2 * lo["zero_bubble"], rel=1e-9), "1F1B's factor carries to zero-bubble"


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
