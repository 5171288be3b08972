"""Experiment specs: the bundled ones load; bad specs name every problem."""
from __future__ import annotations

import pytest
import yaml

from oracle.errors import InvalidConfigError, UnknownComponentError
from searchers.experiment import Experiment, bundled, load_experiment


@pytest.mark.parametrize("name", ["mixtral-8x22b-mi355x-4node", "deepseek-v3-1024", "llama3.1-70b-h100-64",
                                  "tiny-moe-h100-8"])
def test_bundled_experiments_load(name):
    assert name in bundled()
    exp = load_experiment(name)
    assert exp.name == name and exp.budget >= 1 and exp.searcher == "seed_llm"
    assert exp.oracle_mode == "simulate"


def test_mixtral_case_matches_the_paper():
    exp = load_experiment("mixtral-8x22b-mi355x-4node")
    t = exp.baseline.training
    assert (exp.baseline.model.name, exp.baseline.cluster.hardware.name, exp.baseline.cluster.num_gpus) == \
        ("mixtral-8x22b", "mi355x", 32)
    assert (t.gbs, t.seq_len, t.tp, t.pp, t.vpp, t.ep, t.mbs, t.recompute, t.precision, t.schedule) == \
        (512, 8192, 1, 4, 2, 8, 1, "none", "bf16", "interleaved")
    assert exp.budget == 30


def _spec(**changes):
    base = {"model": "tiny-moe", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
            "baseline": {"seq_len": 2048, "gbs": 64, "pp": 2, "ep": 2}, "budget": 10}
    base.update(changes)
    return base


def test_every_problem_is_reported_at_once(tmp_path):
    spec = _spec(budgt=3, seed="x", oracle_mode="fast",
                 searcher={"name": "tpe", "options": {"n_startup": 3}, "llm": {"model": "openai/x"}},
                 space={"pin": {"tpp": 1}, "restrikt": {}})
    spec["baseline"]["tp"] = 3
    with pytest.raises(InvalidConfigError) as err:
        Experiment.from_dict(spec, name="bad")
    text = str(err.value)
    for needle in ["unknown key 'budgt'", "did you mean 'budget'", "seed='x' must be an integer",
                   "oracle_mode='fast'", "unknown key 'n_startup'", "llm only applies to searcher seed_llm",
                   "unknown key 'restrikt'", "num_attention_heads=4 of tiny-moe is not divisible by tp=3"]:
        assert needle in text, needle
    assert "bad.baseline" in text or "tp=3" in text


def test_unknown_searcher_and_unknown_experiment():
    with pytest.raises(InvalidConfigError, match="unknown searcher 'bayes'; valid: .*gp"):
        Experiment.from_dict(_spec(searcher="bayes"))
    with pytest.raises(UnknownComponentError, match="unknown experiment 'nope'; valid: .*tiny-moe-h100-8"):
        load_experiment("nope")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_experiment("missing/file.yaml")


def test_llm_block_is_checked_and_keys_stay_out_of_files(tmp_path):
    with pytest.raises(InvalidConfigError) as err:
        Experiment.from_dict(_spec(searcher={"name": "seed_llm", "llm": {"model": "", "api_key": "sk-x",
                                                                          "timeout_s": -1}}))
    text = str(err.value)
    assert "model must be a LiteLLM model string" in text and "api_key_env" in text and "timeout_s=-1" in text
    ok = Experiment.from_dict(_spec(searcher={"name": "seed_llm", "llm": {
        "model": "openai/gpt-4o", "api_base": "http://127.0.0.1:1/v1", "api_key_env": "MY_KEY"}}))
    assert ok.llm.api_key_env == "MY_KEY" and ok.searcher_options()["llm"] is ok.llm
    # endpoint, key variable, engine and temperature of the wrong kind are named here, not when the LM is built
    # (an int api_base raised TypeError there; found by fuzzing LLMSettings.from_dict)
    with pytest.raises(InvalidConfigError) as err:
        Experiment.from_dict(_spec(searcher={"name": "seed_llm", "llm": {
            "model": "openai/x", "api_base": 1000, "api_key_env": ["K"], "engine": "bogus", "temperature": -1}}))
    text = str(err.value)
    assert ("api_base=1000 must be an endpoint URL" in text and "api_key_env=['K'] must be the NAME" in text
            and "engine='bogus' must be one of litellm | auto | lm15" in text and "temperature=-1 must be" in text)


def test_yaml_file_round_trip(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(_spec(space={"restrict": {"mbs": [1, 2]}})))
    exp = load_experiment(p)
    assert exp.name == "mine" and exp.space.values["mbs"] == (1, 2) and exp.source == str(p)


def test_a_seed_outside_what_the_searchers_take_is_an_error_naming_the_range():
    """Optuna's samplers seed numpy's MT19937 (0..2**32-1) and the ledger stores int64: a seed outside 0..2**32-1
    is refused when the experiment is read (it was a traceback from numpy, or an OverflowError from the ledger)."""
    from searchers.experiment import MAX_SEED
    assert Experiment.from_dict(_spec(seed=MAX_SEED), name="ok").seed == MAX_SEED
    for seed in (-1, MAX_SEED + 1, 2**63):
        with pytest.raises(InvalidConfigError, match=rf"seed={seed} must be in 0\.\.{MAX_SEED}"):
            Experiment.from_dict(_spec(seed=seed), name="bad")
