"""The search space: axes, pins/restrictions, legality from the oracle, enumeration, neighbours."""
from __future__ import annotations

import itertools

import pytest

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.legality import check
from searchers.experiment import load_experiment
from searchers.space import SearchSpace


def _brute_force(sp: SearchSpace) -> set[tuple]:
    """Every combination of the axis values that is legal and canonical, checked one by one."""
    brute = set()
    for combo in itertools.product(*(sp.values[a] for a in sp.axes)):
        values = dict(zip(sp.axes, combo))
        run = sp.run_of(values)
        if not check(run) and sp.point_of(run) == values:  # legal and canonical
            brute.add(combo)
    return brute


def test_every_enumerated_point_is_legal_and_brute_force_agrees(tiny):
    sp = tiny.space
    pts = set(sp.points)
    assert len(pts) == sp.size > 100
    assert pts == _brute_force(sp)
    for p in list(sp.iter_points())[::37]:
        assert sp.contains(p)
        assert check(sp.run_of(p)) == []


def test_enumeration_answers_most_combinations_from_the_read_memo(tiny):
    sp = tiny.space
    assert sp.points  # enumerated (the brute-force test above checks the same points come out)
    memo = sp._verdicts
    assert memo.hits > memo.misses > 0  # combinations differing only in unread fields reuse a verdict


def test_counts_for_mixtral_on_32_gpus_are_order_ten_to_the_four():
    sp = load_experiment("mixtral-8x22b-mi355x-4node").space
    s = sp.summary()
    assert 10_000 <= s["size"] <= 200_000, s
    assert s["raw_size"] > s["size"]
    assert 100 <= s["num_layouts"] <= 1000
    assert set(sp.axes) >= {"tp", "pp", "vpp", "ep", "cp", "mbs", "pp_schedule", "recompute", "precision",
                            "moe_a2a_backend", "moe_sync_free", "use_distributed_optimizer", "fsdp"}


def test_pins_and_restrictions(tiny):
    sp = SearchSpace(tiny.baseline, pins={"precision": "bf16"}, restrict={"mbs": [2, 1], "recompute": ["full"]})
    assert sp.values["precision"] == ("bf16",) and "precision" not in sp.axes
    assert sp.values["mbs"] == (2, 1)
    assert all(p["recompute"] == "full" for p in sp.iter_points()) if "recompute" in sp.axes else True
    assert sp.baseline.training.recompute == "full"
    # any TrainingConfig field may be restricted, turning it into an axis
    sp2 = SearchSpace(tiny.baseline, restrict={"overlap_grad_reduce": [True, False]})
    assert "overlap_grad_reduce" in sp2.axes


def test_bad_pins_and_restrictions_name_every_problem(tiny):
    with pytest.raises(InvalidConfigError) as err:
        SearchSpace(tiny.baseline, pins={"tpp": 2, "mbs": "x"}, restrict={"mbs": [], "pp_schedule": ["1f2b"],
                                                                           "cp": 2})
    text = str(err.value)
    assert "'tpp'" in text and "did you mean 'tp'" in text
    assert "both pinned and restricted" in text
    assert "1f2b" in text
    assert "non-empty list" in text


def test_validate_reports_unknown_outside_and_illegal(tiny):
    sp = tiny.space
    run, problems = sp.validate({"tp": 16, "foo": 1})
    assert run is None
    assert any("unknown key 'foo'" in p for p in problems)
    assert any("tp=16 is outside the search space" in p for p in problems)
    run, problems = sp.validate({"pp": 4, "vpp": 2, "pp_schedule": "interleaved"})
    assert run is not None and any("num_layers=4 is not divisible by pp*vpp" in p for p in problems)
    run, problems = sp.validate({"pp_schedule": "zero_bubble"})
    assert problems == [] and run.training.pp_schedule == "zero_bubble"


def test_canonical_forms_merge_equivalent_configs(tiny):
    sp = tiny.space
    # ep=1: the dispatcher is all-to-all whatever was asked
    run = sp.make({"ep": 1, "moe_a2a_backend": "deepep"})
    assert run.training.moe_a2a_backend == "alltoall"
    assert run.key() == sp.make({"ep": 1}).key()
    # a sync-free MoE (Primus-Turbo: AMD Instinct) runs on DeepEP: with the all-to-all dispatcher it is off
    amd = SearchSpace(RunConfig.from_dict({**sp.baseline.to_dict(), "cluster": {"hardware": "mi355x", "num_gpus": 8}}))
    run = amd.make({"ep": 2, "moe_a2a_backend": "alltoall", "moe_sync_free": True})
    assert run.training.moe_sync_free is False
    assert amd.make({"ep": 2, "moe_a2a_backend": "deepep", "moe_sync_free": True}).training.moe_sync_free
    # on an NVIDIA part there is no such path: the axis holds false
    assert sp.values["moe_sync_free"] == (False,)
    # 'auto' schedule resolves to the concrete one
    assert sp.baseline.training.pp_schedule != "auto"
    assert all(p.get("pp_schedule") != "auto" for p in sp.iter_points())


def test_nearest_legal_point(tiny):
    sp = tiny.space
    p = sp.nearest({"pp": 4, "vpp": 2, "pp_schedule": "interleaved", "tp": 2})
    assert sp.contains(p)
    assert p["tp"] == 2
    legal = sp.point(5)
    assert sp.nearest(legal) == legal


def test_neighbours(tiny):
    sp = tiny.space
    base = sp.point_of(sp.baseline)
    assert sp.neighbours(base, "mbs") == [2]           # adjacent values of a numeric axis
    assert sorted(sp.neighbours(base, "recompute")) == ["none", "selective"]  # all others of a categorical one


def test_describe_and_fingerprint(tiny):
    sp = tiny.space
    d = sp.describe()
    assert set(d["axes"]) == set(sp.axes) and d["fixed"]["seq_len"] == 2048
    again = SearchSpace(RunConfig.from_dict(tiny.baseline.to_dict()), pins=tiny.pins, restrict=tiny.restrict)
    assert again.fingerprint == sp.fingerprint


def test_pinned_settings_that_need_another_structure_than_the_baselines_are_searched():
    # a recipe's software settings held (raytune-primus tune --bridge-recipe): the static HybridEP budget, the fused
    # grouped MLP and full-iteration CUDA graphs need EP > 1 with the HybridEP dispatcher, which the baseline (EP 1)
    # does not have; canonical form must not rewrite the pinned dispatcher, and the flag combinations must be kept
    pins = {"moe_a2a_backend": "hybridep", "moe_expert_rank_capacity_factor": 1.5, "fused_grouped_mlp": True,
            "cuda_graph_impl": "full_iteration", "moe_a2a_overlap": True, "moe_flex_dispatcher_num_sms": 32}
    template = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                                    "training": {"seq_len": 4096, "gbs": 512, "precision": "fp8",
                                                 "fp8_recipe": "mxfp8", **pins}}, check=False)
    space = SearchSpace(template, pins=pins, restrict={"pp_schedule": ["1f1b", "interleaved"]})
    assert space.size > 0 and space.baseline.training.moe_a2a_backend == "hybridep"
    for values in itertools.islice(space.iter_values(), 0, None, max(1, space.size // 50)):
        run = space.run_of(values)
        assert run.training.moe_a2a_backend == "hybridep" and run.training.ep > 1 and not check(run)
    # brute force over the axes (legal and canonical) agrees with the enumeration
    assert _brute_force(space) == set(space.points)


def _with_software(exp):
    sp = exp.space
    return SearchSpace(sp.baseline, pins=sp.pins, restrict=sp.restrict, allow=(*sp.allow, "software"))


def test_the_software_group_opens_what_the_part_and_the_framework_run():
    b200 = _with_software(load_experiment("qwen3-30b-a3b-b200-8"))
    v = b200.values
    assert v["moe_a2a_backend"] == ("alltoall", "deepep", "hybridep")
    assert v["cuda_graph_impl"] == ("none", "transformer_engine", "full_iteration")
    assert v["cuda_graph_scope"] == ((), ("attn", "moe_router", "moe_preprocess"))
    for flag in ("moe_a2a_overlap", "moe_router_fusion", "fused_grouped_mlp", "fp8_param_gather"):
        assert v[flag] == (False, True), flag
    assert "moe_shared_expert_overlap" not in b200.axes  # Qwen3-30B-A3B has no shared experts
    amd = _with_software(load_experiment("mixtral-8x22b-mi355x-4node"))  # no HybridEP, CUDA graphs or CuTe DSL there
    assert "hybridep" not in amd.values["moe_a2a_backend"]
    assert {"cuda_graph_impl", "fused_grouped_mlp"}.isdisjoint(amd.axes) and "moe_a2a_overlap" in amd.axes
    dense = _with_software(load_experiment("llama3.1-70b-h100-64"))
    assert set(dense.axes) - set(load_experiment("llama3.1-70b-h100-64").space.axes) == {"cuda_graph_impl",
                                                                                          "fp8_param_gather"}
    assert dense.values["cuda_graph_scope"] == ((),)  # the whole layer: no MoE block to leave out
    # the baseline's settings are always points of the space, and every point is legal
    assert b200.contains(b200.point_of(b200.baseline))
    for p in b200.points[::max(1, b200.size // 40)]:
        assert not check(b200.run_of(p))


def test_flag_combinations_a_rule_refuses_without_reading_the_structure_are_skipped_soundly(tiny, monkeypatch):
    # the enumeration drops a flag combination that a rule group of the oracle's refuses having read no structure
    # field (oracle.legality.RULES) instead of trying it on every structure: the same points either way, and the
    # brute force over the whole product agrees
    fast = _with_software(tiny)
    fast_points = fast.points
    assert fast.size > 5 * tiny.space.size
    monkeypatch.setattr(SearchSpace, "_refused_by_a_flag_rule", lambda self, kw, structural: False)
    assert _with_software(tiny).points == fast_points
    small = SearchSpace(tiny.space.baseline, allow=("software",),
                        restrict={"tp": [1], "cp": [1], "pp": [1, 2], "vpp": [1, 2], "mbs": [1], "ep": [1, 4],
                                  "pp_schedule": ["1f1b", "interleaved"], "recompute": ["none", "full"]},
                        pins={"precision": "fp8", "fsdp": False})
    brute = _brute_force(small)
    assert brute == set(small.points) and len(brute) > 20


def test_a_results_training_with_a_tuple_setting_maps_back_to_its_point(tiny):
    sp = _with_software(tiny)
    p = next(p for p in sp.iter_points() if p["cuda_graph_scope"])
    training = sp.run_of(p).to_dict()["training"]  # JSON form: the scope as a list
    assert isinstance(training["cuda_graph_scope"], list)
    assert sp.point_of(training) == p


def test_every_rule_group_the_shortcut_asks_is_applied_by_the_check(tiny):
    # the enumeration's shortcut is sound only if each of oracle.legality.RULES is part of every check
    from oracle.legality import RULES
    sp = _with_software(tiny)
    seen = 0
    for combo in itertools.islice(itertools.product(*(sp.values[a] for a in sp.axes)), 0, None, 97):
        run = sp.run_of(dict(zip(sp.axes, combo)))
        problems = set(check(run))
        for rule in RULES:
            found = rule(run)
            seen += bool(found)
            assert set(found) <= problems, (rule.__name__, found)
    assert seen > 10
