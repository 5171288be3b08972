"""The optimizer step (oracle.optimizers): AdamW's HBM traffic, Muon's Newton-Schulz GEMMs and who runs them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.hardware import load_hardware
from oracle.optimizers import EXPERT_MATRICES, layer_newton_schulz_s, newton_schulz_s
from oracle.opgraph import GEMM, Shapes, layer_ops
from oracle.projector import project


def _run(model: str, n: int, **training) -> RunConfig:
    tr = {"seq_len": 4096, "gbs": 256, "use_distributed_optimizer": True, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": "h100-sxm", "num_gpus": n}, "training": tr})


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rows=st.integers(64, 16384), cols=st.integers(64, 16384), steps=st.integers(1, 8))
def test_newton_schulz_is_at_least_its_flops_at_peak(rows, cols, steps):
    """Each quintic step: X X^T (2 a^2 b FLOPs), A A (2 a^3), B X (2 a^2 b), a = min and b = max of the sizes."""
    hw = load_hardware("h100-sxm")
    a, b = sorted((rows, cols))
    flops = steps * (4.0 * a * a * b + 2.0 * a ** 3)
    assert newton_schulz_s(hw, rows, cols, steps) >= flops / hw.peak_flops_per_s["bf16"]
    assert newton_schulz_s(hw, rows, cols, steps) == pytest.approx(steps * newton_schulz_s(hw, rows, cols, 1))


def test_a_layers_matrices_split_into_dense_and_routed_expert_ones():
    run = _run("qwen3-30b-a3b", 16, ep=8)
    ops = layer_ops(run.model, Shapes.of(run), "moe")
    hw = run.cluster.hardware
    dense, expert = layer_newton_schulz_s(hw, ops, 5)
    want = {name: sum(op.groups * newton_schulz_s(hw, op.k, op.n, 5) for op in ops
                      if op.kind == GEMM and op.has_wgrad and (op.name in EXPERT_MATRICES) == name)
            for name in (False, True)}
    assert (dense, expert) == pytest.approx((want[False], want[True]))
    assert expert > 0 and dense > 0


def test_muon_expert_matrices_are_orthogonalised_by_their_expert_data_parallel_owners():
    """Megatron-Core's LayerWiseDistributedOptimizer deals routed-expert matrices over the expert data-parallel
    group: with EP over every data-parallel rank (edp = 1) each rank orthogonalises all its local experts' matrices
    itself, so its step costs at least their Newton-Schulz time (not that time over dp)."""
    run = _run("qwen3-30b-a3b", 16, ep=16, optimizer="muon")
    hw = run.cluster.hardware
    ops = layer_ops(run.model, Shapes.of(run), "moe")
    local_experts_s = run.model.num_layers * layer_newton_schulz_s(hw, ops, run.training.muon_ns_steps)[1]
    step = project(run, memory_tree=False).breakdown.optimizer_s
    assert step >= local_experts_s
    adam = project(_run("qwen3-30b-a3b", 16, ep=16), memory_tree=False).breakdown.optimizer_s
    assert step > adam + local_experts_s * 0.99  # the GEMMs come on top of the (lighter) elementwise pass


def test_muon_dense_matrices_spread_over_the_data_parallel_ranks():
    """A dense model's matrices are dealt over dp: twice the data-parallel ranks, about half the Newton-Schulz work
    per rank (the elementwise pass halves with the shard too)."""
    small = project(_run("llama3.1-8b", 8, tp=2, optimizer="muon", gbs=64), memory_tree=False).breakdown.optimizer_s
    big = project(_run("llama3.1-8b", 16, tp=2, optimizer="muon", gbs=64), memory_tree=False).breakdown.optimizer_s
    assert big == pytest.approx(small / 2, rel=0.05)


def test_without_the_distributed_optimizer_every_rank_orthogonalises_every_matrix_it_holds():
    """Megatron-LM builds the layer-wise distributed optimizer from --optimizer muon --use-distributed-optimizer;
    without that flag each data-parallel rank runs Newton-Schulz on all its matrices."""
    dealt = project(_run("llama3.1-8b", 16, tp=2, optimizer="muon", gbs=64), memory_tree=False).breakdown.optimizer_s
    every = project(_run("llama3.1-8b", 16, tp=2, optimizer="muon", gbs=64, use_distributed_optimizer=False),
                    memory_tree=False).breakdown.optimizer_s
    assert every > 4 * dealt  # 8 data-parallel ranks share the GEMMs in the first, none in the second


def test_muon_with_fsdp_is_refused_under_megatron_and_dealt_over_fsdp_under_torchtitan():
    """Megatron-LM's emerging optimizers refuse FSDP; TorchTitan's DistMuon runs over FSDP2, each rank
    orthogonalising the complete matrices it owns (distributed/flex_shard/dist_muon.py)."""
    with pytest.raises(Exception, match="optimizer=muon cannot run with fsdp=true"):
        _run("llama3.1-8b", 8, optimizer="muon", fsdp=True, use_distributed_optimizer=False)
    tt = {"framework": "torchtitan", "optimizer": "muon", "tp": 2, "gbs": 64}
    small = project(_run("llama3.1-8b", 8, **tt), memory_tree=False).breakdown.optimizer_s
    big = project(_run("llama3.1-8b", 16, **tt), memory_tree=False).breakdown.optimizer_s
    assert big == pytest.approx(small / 2, rel=0.05)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_fused_qkv_weight_is_orthogonalised_as_its_q_k_and_v_blocks(tp):
    """Megatron-Core's muon_split_qkv (default on): linear_qkv's Q, K and V rows (per query group, gathered) are
    three matrices to Newton-Schulz, not one; GQA's K and V blocks are kv_heads x head_dim rows each on a rank."""
    run = _run("llama3.1-8b", 8, tp=tp, gbs=64)
    hw, m = run.cluster.hardware, run.model
    ops = layer_ops(m, Shapes.of(run), "dense")
    qkv = next(op for op in ops if op.name == "qkv")
    kv = max(1, m.kv_heads // tp) * m.head_size
    rows = (m.q_width // tp, kv, kv)
    assert sum(rows) == qkv.n
    split, _ = layer_newton_schulz_s(hw, ops, 5, rows)
    whole, _ = layer_newton_schulz_s(hw, ops, 5)
    blocks = sum(newton_schulz_s(hw, qkv.k, r, 5) for r in rows)
    assert split - whole == pytest.approx(blocks - newton_schulz_s(hw, qkv.k, qkv.n, 5))


@pytest.mark.parametrize("given, training, ignored", [
    ("optimizer=dist_muon", {"optimizer": "muon", "use_distributed_optimizer": True}, []),
    ("optimizer=OptimizerType.MUON;muon_split_qkv=true;muon_tp_mode=blockwise", {"optimizer": "muon"}, []),
    ("optimizer=muon;muon_tp_mode=duplicated;muon_momentum=0.95", {"optimizer": "muon"},
     ["muon_tp_mode", "muon_momentum"]),
    ("optimizer=lion", {}, ["optimizer"]),
    ("optimizer=AdamW", {"optimizer": "adam"}, []),
])
def test_a_recipe_names_its_optimizer_as_megatron_lm_does(given, training, ignored):
    """--optimizer dist_muon is Muon with the layer-wise distributed optimizer (Megatron-LM arguments.py); an
    optimizer or a Muon mode this projection does not price is listed as ignored, never taken silently."""
    from oracle.recipe import read_recipe
    r = read_recipe(given)
    assert r.training == training
    assert [e.key for e in r.ignored] == ignored
