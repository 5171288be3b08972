"""RunConfig identity by content: key() hashes the card's and profile's content, to_dict round-trips
inline and edited components, and a bundled component is still named by its name."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.hardware import bundled_hardware, load_hardware, profile_from_dict, profile_to_dict

BASE = {"model": "tiny-moe", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
        "training": {"seq_len": 2048, "gbs": 64, "pp": 2, "ep": 2}}


def _run() -> RunConfig:
    return RunConfig.from_dict(BASE)


def test_bundled_components_are_written_by_name():
    d = _run().to_dict()
    assert d["model"] == "tiny-moe" and d["cluster"]["hardware"] == "h100-sxm"
    assert RunConfig.from_dict(d).key() == _run().key()


@settings(max_examples=20, deadline=None)
@given(layers=st.sampled_from([2, 4, 6, 8, 16, 64]), hidden_scale=st.sampled_from([1, 2, 4]))
def test_an_edited_card_gets_another_key_and_round_trips_inline(layers, hidden_scale):
    run = _run()
    card = run.model.replace(num_layers=layers, hidden_size=run.model.hidden_size * hidden_scale)
    edited = dataclasses.replace(run, model=card)  # same name and reference, other content
    assert (edited.key() == run.key()) == (card == run.model)
    d = edited.to_dict()
    if card != run.model:
        assert isinstance(d["model"], dict)
    back = RunConfig.from_dict(d)
    assert back.model == card and back.key() == edited.key() and back.to_dict() == d


def test_an_inline_card_round_trips():
    inline = {**BASE, "model": {**_run().model.to_dict(), "name": "my-moe", "num_layers": 6}}
    run = RunConfig.from_dict(inline)
    back = RunConfig.from_dict(run.to_dict())
    assert back.model == run.model and back.key() == run.key()


def test_the_key_ignores_names_and_citations_only():
    run = _run()
    renamed = dataclasses.replace(run, model=run.model.replace(name="renamed", notes="a note"), model_ref="renamed")
    assert renamed.key() == run.key()


def test_every_bundled_profile_round_trips_through_its_yaml_form():
    for name in bundled_hardware():
        hw = load_hardware(name)
        assert profile_from_dict(profile_to_dict(hw), name) == hw


def test_an_edited_profile_gets_another_key_and_round_trips_inline():
    run = _run()
    hw = dataclasses.replace(run.cluster.hardware, hbm_capacity_bytes=run.cluster.hardware.hbm_capacity_bytes * 2)
    edited = dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, hardware=hw))
    assert edited.key() != run.key()
    d = edited.to_dict()
    assert isinstance(d["cluster"]["hardware"], dict)
    back = RunConfig.from_dict(d)
    assert back.cluster.hardware == hw and back.key() == edited.key()


def test_a_key_names_the_non_default_training_values_only():
    """Adding a training key with a default must not change any existing configuration's key (searches
    break exact ties by key, docs/search.md): the key hashes the values that differ from the defaults."""
    from oracle.config import RunConfig

    base = {"model": "llama3-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
            "training": {"seq_len": 4096, "gbs": 64}}
    run = RunConfig.from_dict(base)
    stated = RunConfig.from_dict({**base, "training": {**base["training"], "tp": 1, "cuda_graph_impl": "none",
                                                       "fp8_recipe": "delayed"}})
    assert run.key() == stated.key()  # stating a default names the same configuration
    assert RunConfig.from_dict({**base, "training": {**base["training"], "tp": 2}}).key() != run.key()
