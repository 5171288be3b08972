"""Fine-grained activation offloading (TrainingConfig.offload_modules, Megatron-Core fine_grained_activation_offloading):
what the listed modules save leaves HBM between forward and backward and crosses the host link."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import OFFLOAD_MIN_BYTES, blocks, shape_of
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import offloaded_bytes_per_microbatch
from oracle.opgraph import Shapes, layer_ops
from oracle.projector import project
from oracle.recipe import megatron_args, read_recipe

MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act", "fused_group_mlp")


def _run(offload=None, hardware: str = "gb300-nvl72", **training) -> RunConfig:
    training = {"seq_len": 4096, "gbs": 256, "mbs": 2, "ep": 64, "fsdp": True, "use_megatron_fsdp": True,
                **training, "offload_modules": offload}
    return RunConfig.from_dict({"model": "deepseek-v3", "cluster": {"hardware": hardware, "num_gpus": 64},
                                "training": training})


def test_the_offloaded_bytes_are_what_the_modules_ops_save():
    run = _run(["core_attn", "attn_proj"])
    ops = {op.name: op for op in layer_ops(run.model, Shapes.of(run), "moe", None)}
    want = sum(x.bytes for name in ("attn_core", "attn_out") for x in ops[name].saved if x.bytes >= OFFLOAD_MIN_BYTES)
    b = blocks(run.model, shape_of(run))
    assert b.layer("moe").offloaded("none", frozenset(), frozenset({"core_attn", "attn_proj"})) == pytest.approx(want)
    # softmax statistics below Megatron-Core's min_offloaded_tensor_size stay (Llama 3 8B, 4,096 tokens: 512 KiB)
    small = RunConfig.from_dict({"model": "llama3-8b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                                 "training": {"seq_len": 4096, "gbs": 64, "offload_modules": ["core_attn"]}})
    core = next(op for op in layer_ops(small.model, Shapes.of(small), "dense", None) if op.name == "attn_core")
    lse = next(x for x in core.saved if x.name == "softmax_lse")
    assert lse.bytes < OFFLOAD_MIN_BYTES
    assert blocks(small.model, shape_of(small)).layer("dense").offloaded(
        "none", frozenset(), frozenset({"core_attn"})) == pytest.approx(sum(x.bytes for x in core.saved) - lse.bytes)
    # per micro-batch: every decoder layer of the stage (pp 1: all of them)
    per_layer = {k: b.layer(k).offloaded("none", frozenset(), frozenset({"core_attn", "attn_proj"}))
                 for k in set(run.model.layer_kinds)}
    assert offloaded_bytes_per_microbatch(run) == pytest.approx(sum(per_layer[k] for k in run.model.layer_kinds))


def test_it_lowers_the_peak_by_the_offloaded_bytes_less_one_layers_reload():
    base, off = project(_run()), project(_run(["core_attn", "attn_proj", "expert_fc1", "moe_act"]))
    saved = offloaded_bytes_per_microbatch(_run(["core_attn", "attn_proj", "expert_fc1", "moe_act"]))
    drop = base.memory.peak_bytes - off.memory.peak_bytes
    assert 0 < drop < saved  # one layer's reload is back on the GPU for its backward
    assert drop > 0.95 * saved
    assert off.breakdown.compute_s == pytest.approx(base.breakdown.compute_s)


@settings(max_examples=25, deadline=None)
@given(st.sets(st.sampled_from(MODULES), min_size=1), st.sampled_from(["b300", "gb300-nvl72"]),
       st.sampled_from(["none", "selective"]))
def test_offloading_never_raises_memory_and_hides_at_most_its_copies(mods, hardware, recompute):
    if "attn_proj" in mods:
        mods |= {"core_attn"}
    base = project(_run(hardware=hardware, recompute=recompute))
    off = project(_run(sorted(mods), hardware=hardware, recompute=recompute))
    assert off.memory.peak_bytes <= base.memory.peak_bytes
    term = next(c for c in off.breakdown.comm if c.kind == "cpu_offload")
    assert 0 <= term.exposed_s <= term.total_s
    assert off.iteration_time_s == pytest.approx(base.iteration_time_s + term.exposed_s, rel=1e-9)


def test_the_slower_host_link_exposes_more():
    fast = project(_run(["core_attn", "attn_proj", "expert_fc1", "moe_act"], hardware="gb300-nvl72"))
    slow = project(_run(["core_attn", "attn_proj", "expert_fc1", "moe_act"], hardware="b300"))
    fast_s, slow_s = (next(c for c in p.breakdown.comm if c.kind == "cpu_offload").exposed_s for p in (fast, slow))
    assert slow_s > fast_s


def test_megatrons_refusals():
    with pytest.raises(InvalidConfigError, match="attn_proj needs core_attn"):
        _run(["attn_proj"])
    with pytest.raises(InvalidConfigError, match="cannot run with cpu_offloading=true"):
        RunConfig.from_dict({"model": "llama3-8b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                             "training": {"seq_len": 4096, "gbs": 64, "cpu_offloading": True,
                                          "cpu_offloading_num_layers": 4, "offload_modules": ["core_attn"]}})
    with pytest.raises(InvalidConfigError, match="with recompute_modules 'moe'"):
        _run(["moe_act"], recompute="selective", recompute_modules=["moe"])
    with pytest.raises(InvalidConfigError, match="framework=torchtitan has none"):
        RunConfig.from_dict({"model": "llama3-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                             "training": {"seq_len": 4096, "gbs": 64, "framework": "torchtitan",
                                          "offload_modules": ["core_attn"]}})


def test_the_recipe_reads_it_only_with_the_switch_and_the_export_writes_it():
    on = read_recipe({"fine_grained_activation_offloading": True, "offload_modules": ["core_attn", "attn_proj"]})
    assert on.training == {"offload_modules": ["core_attn", "attn_proj"]}
    off = read_recipe({"fine_grained_activation_offloading": False, "offload_modules": ["expert_fc1"]})
    assert off.training == {} and all(e.status == "ignored" for e in off.entries)
    with pytest.raises(InvalidConfigError, match="needs offload_modules"):
        read_recipe({"fine_grained_activation_offloading": True})
    written = dict(megatron_args(_run(["core_attn", "attn_proj"]).training))
    assert written["fine_grained_activation_offloading"] is True
    assert written["offload_modules"] == ["core_attn", "attn_proj"] and written["env.NVTE_CPU_OFFLOAD_V1"] == 1
    back = read_recipe([(k, v) for k, v in written.items() if not k.startswith("env.")]).training
    assert back["offload_modules"] == ["core_attn", "attn_proj"]
