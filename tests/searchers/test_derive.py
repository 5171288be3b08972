"""An experiment derived from a model and a cluster (searchers.derive): its baseline is the planner's first
memory-legal point, its numerics are the user's, and its YAML loads as the same experiment."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oracle.errors import InvalidConfigError
from oracle.hf_import import card_from_hf_config
from oracle.yamlio import load_mapping
from searchers.derive import SAVERS, _walk, derive_spec, starting_point
from searchers.evaluator import OracleEvaluator
from searchers.experiment import Experiment, load_experiment
from searchers.space import NUMERICS_AXES, SearchSpace

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"


@pytest.fixture(scope="module")
def llama70b():
    return derive_spec(model="llama3.1-70b", hardware="h100-sxm", num_gpus=64, seq_len=8192, gbs=128)


def _load_yaml(derived, tmp_path) -> Experiment:
    path = tmp_path / "exp.yaml"
    path.write_text(derived.yaml())
    return load_experiment(str(path))


def test_the_written_yaml_loads_as_the_derived_experiment(llama70b, tmp_path):
    direct = Experiment.from_dict(llama70b.spec, name=llama70b.spec["name"])
    loaded = _load_yaml(llama70b, tmp_path)
    assert loaded.name == direct.name == "llama3.1-70b-h100-sxm-64gpu-seq8192-gbs128-bf16"
    assert loaded.baseline.key() == direct.baseline.key()
    assert loaded.space.fingerprint == direct.space.fingerprint
    assert (loaded.searcher, loaded.budget, loaded.seed, loaded.oracle_mode) == ("seed_llm", 30, 0, "simulate")
    text = llama70b.yaml()
    assert text.startswith("# Derived by: raytune-primus experiments init --model llama3.1-70b")
    assert "Numerics are the user's: precision=bf16" in text


def test_the_baseline_is_the_first_point_of_the_walk_that_fits(llama70b):
    exp = Experiment.from_dict(llama70b.spec, name="x")
    ev = OracleEvaluator()
    mem = ev.memory(exp.baseline)
    assert mem.peak_bytes <= mem.cap_bytes and mem.peak_bytes == pytest.approx(llama70b.baseline_peak_bytes)
    # every legal point the walk meets before it is over the cap
    space = exp.space
    before = 0
    for values in _walk(space):
        run, problems = space.validate(values)
        if run is not None and run.key() == exp.baseline.key():
            break
        if not problems:
            before += 1
            m = ev.memory(run)
            assert m.peak_bytes > m.cap_bytes, values
    assert before >= llama70b.tried > 0
    t = exp.baseline.training
    assert (t.tp * t.cp * t.pp, t.mbs, t.vpp) == (1, 1, 1)  # 64 H100s hold 70B unsplit once FSDP shards it


def test_numerics_are_held_at_what_the_user_gave():
    d = derive_spec(model="tiny-moe", hardware="h100-sxm", num_gpus=8, seq_len=2048, gbs=64, precision="fp8",
                    sets=["fp8_recipe=blockwise"])
    exp = Experiment.from_dict(d.spec, name="x")
    t = exp.baseline.training
    assert (t.precision, t.fp8_recipe) == ("fp8", "blockwise")
    assert not set(NUMERICS_AXES) & set(exp.space.axes)
    assert exp.space.pins == {"fp8_recipe": "blockwise"}
    opened = derive_spec(model="tiny-moe", hardware="h100-sxm", num_gpus=8, seq_len=2048, gbs=64,
                         allow=["precision", "token_drop"])
    exp = Experiment.from_dict(opened.spec, name="y")
    assert exp.allow == ("precision", "token_drop") and {"precision", "fp8_recipe"} <= set(exp.space.axes)
    assert opened.spec["name"] != d.spec["name"]


def test_set_holds_a_key_and_coerces_it():
    d = derive_spec(model="llama3.1-8b", hardware="h100-sxm", num_gpus=16, seq_len=8192, gbs=256,
                    sets=["cp=2", "training.recompute=selective", "cluster.memory_margin=0.05"])
    exp = Experiment.from_dict(d.spec, name="x")
    assert exp.space.values["cp"] == (2,) and exp.space.values["recompute"] == ("selective",)
    assert exp.baseline.cluster.memory_margin == 0.05
    assert d.spec["space"]["pin"] == {"cp": 2, "recompute": "selective"}


def test_a_hugging_face_config_works_as_the_model(tmp_path):
    path = HF / "llama-3.1-8b" / "config.json"
    d = derive_spec(model=str(path), hardware="h100-sxm", num_gpus=8, seq_len=4096, gbs=64)
    exp = _load_yaml(d, tmp_path)
    card = card_from_hf_config(load_mapping(path), name="llama-3.1-8b")
    assert exp.baseline.model.total_params() == card.total_params()
    assert isinstance(yaml.safe_load(d.yaml())["model"], dict)  # written inline: the file stands alone


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "llama3.1-405b", "num_gpus": 1}, "fits in memory"),
    ({"sets": ["tpp=2"]}, "unknown key 'tpp'"),
    ({"sets": ["model.num_layers=2"]}, "only training keys"),
    ({"sets": ["cluster=x"]}, "only training keys"),
    ({"allow": ["precison"]}, "--allow: unknown group 'precison'"),
    ({"precision": "fp16"}, "precision"),
    ({"model": "no-such-model"}, "no-such-model"),
])
def test_bad_input_is_one_line(kwargs, message):
    args = {"model": "llama3.1-8b", "hardware": "h100-sxm", "num_gpus": 8, "seq_len": 4096, "gbs": 64, **kwargs}
    with pytest.raises(InvalidConfigError) as e:
        derive_spec(**args)
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_the_walk_tries_the_cheapest_saver_first_at_each_layout(tiny):
    space = SearchSpace(tiny.baseline.with_training(tp=1, pp=1, cp=1, ep=1), restrict={"fsdp": [False, True]})
    first = list(_walk(space))[:len(SAVERS)]
    assert [(c["recompute"], c["fsdp"]) for c in first] == [s for s in SAVERS if s[0] in space.values["recompute"]]
    assert {(c["tp"], c["cp"], c["pp"]) for c in first} == {(1, 1, 1)}


def test_starting_point_takes_any_evaluator(tiny):
    from searchers.testing import SyntheticEvaluator
    run, peak, cap, tried = starting_point(tiny.space, SyntheticEvaluator(cap_bytes=1.56 * 2**30))
    assert peak <= cap and tiny.space.contains(tiny.space.point_of(run))
