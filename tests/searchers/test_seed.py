"""The seed planner walks the paper's Appendix C.1 order, anchored on the baseline."""
from __future__ import annotations

from searchers.experiment import load_experiment
from searchers.seed import seed_plan


def test_mixtral_seed_order_follows_the_paper():
    exp = load_experiment("mixtral-8x22b-mi355x-4node")
    plan = seed_plan(exp.space)
    notes = [c.note for c in plan]
    assert notes == [
        "baseline",
        "recompute=full", "recompute=selective",                 # baseline already has none
        "precision=fp8",                                         # every lower format of the space (no FP4 here)
        "moe_a2a_backend=deepep",                                # MoE with EP > 1
        "moe_sync_free=true",                                    # paper App. H MoE lever (2), on DeepEP
        "pp_schedule=1f1b",                                      # VPP 3, 4 do not split 14 layers/stage
        "pp_schedule=zero_bubble", "pp_schedule=ilp",            # ILP in the space since issue 27
        "mbs=2", "use_distributed_optimizer=false",              # MBS 1 is the baseline
        "fsdp=true",                                             # the fill-up; the cap of 12 leaves out zbv, ep=4
    ]
    assert len(plan) <= 12
    base = exp.space.point_of(exp.space.baseline)
    for c in plan[1:]:
        changed = {k for k, v in c.values.items() if base[k] != v}
        assert changed == set(c.meta["move"]) and 1 <= len(changed) <= 2    # one axis (schedule+vpp coupled)
        assert c.phase == "seed" and c.proposer == "seed-planner"


def test_seed_skips_dispatcher_without_experts_and_respects_the_cap_of_twelve(tiny):
    exp = load_experiment("llama3.1-70b-h100-64")
    notes = [c.note for c in seed_plan(exp.space)]
    assert not any("moe_a2a_backend" in n for n in notes)
    assert notes[:3] == ["baseline", "recompute=full", "recompute=selective"]
    assert len(seed_plan(tiny.space, max_candidates=5)) == 5
    # every seed candidate is a legal point of its space
    for c in seed_plan(tiny.space):
        assert tiny.space.contains(c.values)


def test_precision_moves_cover_every_lower_format_lowest_first():
    exp = load_experiment("gpt-oss-120b-b200-64")  # B200: FP8 and NVFP4 tensor cores
    notes = [c.note for c in seed_plan(exp.space)]
    assert notes.index("precision=nvfp4") < notes.index("precision=fp8") < notes.index("mbs=2")


def test_a_plan_around_another_anchor_labels_moves_relative_to_it():
    exp = load_experiment("llama3.1-405b-h100-512")
    base = exp.space.point_of(exp.space.baseline)
    anchor = dict(base, recompute="full")
    plan = seed_plan(exp.space, anchor=anchor, max_candidates=40)
    assert plan[0].note == "anchor" and plan[0].values == anchor
    for c in plan[1:]:
        changed = {k for k, v in c.values.items() if anchor[k] != v}
        assert changed == set(c.meta["move"]) and exp.space.contains(c.values)


def test_seed_llm_measures_number_formats_last_on_the_best_seed_point(tiny, tmp_path):
    # a format's gain depends on the GEMM share of the step (micro-batch, dispatcher, schedule), so seed_llm
    # lays the format moves over the best seed point found so far instead of the baseline
    import json

    from searchers.driver import run_search
    from searchers.ledger import read_rows
    from searchers.testing import SyntheticEvaluator
    path = tmp_path / "ledger.parquet"
    run_search(tiny, "seed_llm", 12, 0, ledger_path=path, evaluator=SyntheticEvaluator())
    rows = [r for r in read_rows(path) if r["phase"] == "seed" and r["trial_index"] >= 0]
    base = tiny.baseline.training.precision
    fmt = [i for i, r in enumerate(rows) if json.loads(r["config"])["precision"] != base]
    assert fmt and fmt == list(range(len(rows) - len(fmt), len(rows)))   # the seed phase's last trials
    first = fmt[0]
    best = max((r for r in rows[:first] if r["tokens_per_s_per_gpu"]), key=lambda r: r["tokens_per_s_per_gpu"])
    laid = {k: v for k, v in json.loads(rows[first]["config"]).items() if k != "precision"}
    assert laid == {k: v for k, v in json.loads(best["config"]).items() if k != "precision"}


def test_a2a_overlap_move_only_when_the_axis_is_restricted_in():
    from oracle.config import RunConfig
    from searchers.space import SearchSpace

    base = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                                "training": {"seq_len": 4096, "gbs": 512, "mbs": 4, "ep": 8, "precision": "fp8"}})
    assert "moe_a2a_overlap=true" not in [c.note for c in seed_plan(SearchSpace(base))]
    plan = seed_plan(SearchSpace(base, restrict={"moe_a2a_overlap": [False, True]}))
    move = next(c for c in plan if c.note == "moe_a2a_overlap=true")
    assert move.meta["move"] == {"moe_a2a_overlap": True} and move.values["moe_a2a_overlap"] is True


def test_cuda_graph_moves_only_when_the_axis_is_restricted_in_widest_legal_scope_first():
    from oracle.config import RunConfig
    from searchers.space import SearchSpace

    base = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "b200", "num_gpus": 8},
                                "training": {"seq_len": 4096, "gbs": 512, "mbs": 1, "ep": 8, "precision": "fp8"}})
    assert not [c for c in seed_plan(SearchSpace(base)) if c.note.startswith("cuda_graph")]
    space = SearchSpace(base, restrict={"cuda_graph_impl": ["none", "transformer_engine"],
                                        "cuda_graph_scope": [[], ["attn"], ["attn", "moe_router"]]})
    graphs = [c for c in seed_plan(space, max_candidates=30) if c.note.startswith("cuda_graph")]
    # the whole dropless layer cannot be captured: the widest legal scope comes first
    assert [c.note for c in graphs] == ["cuda_graph_impl=transformer_engine scope=attn+moe_router",
                                        "cuda_graph_impl=transformer_engine scope=attn"]
    assert graphs[0].values["cuda_graph_scope"] == ("attn", "moe_router")
