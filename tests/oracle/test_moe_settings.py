"""MoE software settings as the frameworks run them: the fused grouped MLP is Transformer Engine's CuTe DSL kernel only
where TE runs it (a GLU expert MLP on compute capability 10.x with MXFP8 or NVFP4 inputs, TE 2.20
ops/fused/grouped_mlp.py; elsewhere the op fuser runs the unfused kernels and keeps only the device-side token counts);
HybridEP is NVIDIA's; the shared-expert overlap pairs Megatron-Core refuses."""
from __future__ import annotations

import pytest

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.opgraph import Shapes, cutedsl_grouped_mlp
from oracle.projector import project

STATIC = dict(moe_a2a_backend="hybridep", moe_expert_rank_capacity_factor=1.5)


def _run(hardware: str, precision: str, fp8_recipe: str = "delayed", **training) -> RunConfig:
    t = dict(seq_len=4096, gbs=512, mbs=2, ep=8, precision=precision, fp8_recipe=fp8_recipe, **STATIC)
    t.update(training)
    return RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": hardware, "num_gpus": 8},
                                "training": t})


@pytest.mark.parametrize("hardware,precision,fp8_recipe", [
    ("b200", "fp8", "mxfp8"), ("gb300-nvl72", "fp8", "mxfp8"), ("b300", "nvfp4", "delayed")])
def test_the_cutedsl_kernel_runs_on_blackwell_with_block_scaled_inputs(hardware, precision, fp8_recipe):
    fused, plain = (_run(hardware, precision, fp8_recipe, fused_grouped_mlp=f) for f in (True, False))
    assert cutedsl_grouped_mlp(fused) and Shapes.of(fused).fused_mlp
    assert project(fused).breakdown.compute_s < project(plain).breakdown.compute_s


@pytest.mark.parametrize("hardware,precision,fp8_recipe", [
    ("b200", "bf16", "delayed"),          # TE fuses only MXFP8 / NVFP4 inputs
    ("gb200-nvl72", "fp8", "tensorwise"),  # per-tensor FP8: not block-scaled
    ("h100-sxm", "fp8", "tensorwise"),     # compute capability 9.0: no CuTe DSL grouped MLP
    ("h100-sxm", "bf16", "delayed"),
])
def test_elsewhere_the_op_fuser_prices_the_unfused_kernels_but_keeps_device_counts(hardware, precision, fp8_recipe):
    fused, plain = (_run(hardware, precision, fp8_recipe, fused_grouped_mlp=f) for f in (True, False))
    assert not cutedsl_grouped_mlp(fused) and not Shapes.of(fused).fused_mlp
    f, p = project(fused), project(plain)
    assert f.breakdown.compute_s == pytest.approx(p.breakdown.compute_s)
    # the op fuser's experts read their token counts on the device: with HybridEP's static budget no host sync
    assert fused.training.moe_static_dispatch and not plain.training.moe_static_dispatch
    assert f.breakdown.host_sync_s < p.breakdown.host_sync_s


def test_an_mxfp8_part_that_is_not_nvidia_sm100_runs_no_cutedsl_kernel():
    kw = dict(moe_a2a_backend="deepep", moe_expert_rank_capacity_factor=None)
    fused, plain = (_run("mi355x", "fp8", "mxfp8", fused_grouped_mlp=f, **kw) for f in (True, False))
    assert not cutedsl_grouped_mlp(fused)
    assert project(fused).breakdown.compute_s == pytest.approx(project(plain).breakdown.compute_s)


def test_hybridep_is_nvidia_only():
    with pytest.raises(InvalidConfigError, match="moe_a2a_backend=hybridep is NVIDIA's HybridEP"):
        _run("mi355x", "fp8", "mxfp8")


def test_shared_expert_overlap_pairs_megatron_core_refuses():
    def run(**t):
        return RunConfig.from_dict({"model": "deepseek-v2-lite", "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
                                    "training": {"seq_len": 4096, "gbs": 256, "ep": 8, **t}})
    run(moe_shared_expert_overlap=True)
    run(moe_a2a_overlap=True)
    with pytest.raises(InvalidConfigError, match="disable moe_shared_expert_overlap"):
        run(moe_shared_expert_overlap=True, moe_a2a_overlap=True)
    with pytest.raises(InvalidConfigError, match="shared_experts recompute cannot work"):
        run(moe_shared_expert_overlap=True, recompute="selective", recompute_modules=["shared_experts"])


def test_the_op_fuser_grouped_mlp_refuses_what_megatron_core_asserts_against():
    # Megatron-Core TEGroupedMLP._is_fused_impl_supported: no expert tensor parallelism, no expert_fc1 / moe_act offload
    kw = dict(hardware="gb200-nvl72", precision="fp8", fp8_recipe="mxfp8", fused_grouped_mlp=True)
    with pytest.raises(InvalidConfigError, match="no expert tensor parallelism"):
        _run(etp=2, tp=2, **kw)
    with pytest.raises(InvalidConfigError, match="offload_modules expert_fc1, moe_act"):
        _run(offload_modules=["moe_act", "expert_fc1"], **kw)
    assert _run(offload_modules=["fused_group_mlp"], **kw).training.fused_grouped_mlp


def test_the_all_to_all_overlap_refuses_what_megatron_core_asserts_against():
    def run(**t):
        return RunConfig.from_dict({"model": "deepseek-v3", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 256},
                                    "training": {"seq_len": 4096, "gbs": 4096, "pp": 4, "vpp": 4, "ep": 64,
                                                 "pp_schedule": "interleaved", "moe_a2a_overlap": True, **t}},
                                   check=False)
    from oracle.legality import check
    assert not [q for q in check(run()) if "moe_a2a_overlap" in q]
    assert any("'disable moe in recompute_modules" in q
               for q in check(run(recompute="selective", recompute_modules=["moe"])))
    assert any("MTP supports at most one layer" in q for q in check(run(mtp_num_layers=2)))


@pytest.mark.parametrize("training, message", [
    (dict(recompute="full", cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"]),
     "full recompute is only supported with full iteration CUDA graph"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe", "moe_router"],
          moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True), "must not contain both moe and"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_preprocess"]),
     "only supported with moe_router cuda graph"),
    (dict(recompute="selective", recompute_modules=["moe"], cuda_graph_impl="transformer_engine",
          cuda_graph_scope=["attn", "moe_router"]), "moe recompute is not supported with moe_router CUDA graph"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["moe"], moe_a2a_backend="hybridep",
          moe_expert_rank_capacity_factor=1.5, fused_grouped_mlp=True, precision="fp8", fp8_recipe="mxfp8"),
     "only supported with drop-padding MoE"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_router", "moe_preprocess"],
          moe_expert_capacity_factor=1.0), "DtoH copies and synchronizations in the preprocess step"),
])
def test_per_layer_cuda_graphs_refuse_what_megatron_core_asserts_against(training, message):
    from oracle.legality import check
    run = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "b200", "num_gpus": 8},
                               "training": {"seq_len": 4096, "gbs": 512, "ep": 8, **training}}, check=False)
    assert any(message in q for q in check(run)), check(run)


def test_the_scopes_nvidias_moe_recipes_capture_stay_legal():
    from oracle.legality import check
    run = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "b200", "num_gpus": 8},
                               "training": {"seq_len": 4096, "gbs": 512, "ep": 8, "cuda_graph_impl": "transformer_engine",
                                            "cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}})
    assert not check(run)


def test_full_recompute_runs_under_a_whole_iteration_graph_either_spelling():
    from oracle.legality import check
    for graph in (dict(cuda_graph_impl="full_iteration"),
                  dict(cuda_graph_impl="local", cuda_graph_scope=["full_iteration"])):
        run = RunConfig.from_dict({"model": "llama3.1-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                   "training": {"seq_len": 4096, "gbs": 64, "recompute": "full", **graph}}, check=False)
        assert not [q for q in check(run) if "full recompute" in q], graph
