"""Saved activations come from the op graph: a layer's saved bytes are the sum of its ops' ``saved`` tensors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import oracle.activations as activations
from oracle.activations import MemoryAssumptions, blocks, module_of, shape_of
from oracle.config import RunConfig
from oracle.memory import layer_activation_bytes, module_tree
from oracle.model_card import load_model
from oracle.opgraph import BF16, FP8, FP32, KEPT, SELECTIVE, Op, Saved, layer_ops, moe_pairs

CARDS = sorted(p.stem for p in (Path(__file__).parents[2] / "oracle" / "models").glob("*.yaml"))


def make(model: str, num_gpus: int = 4, **training) -> RunConfig:
    training.setdefault("seq_len", 1024)
    training.setdefault("gbs", 16)
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": "h100-sxm", "num_gpus": num_gpus},
                                "training": training})


def _kinds(run: RunConfig) -> list[str]:
    return sorted(set(run.model.layer_kinds))


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("assumptions", [MemoryAssumptions(), MemoryAssumptions(flash_attention=False, dropout=True)])
def test_layer_activation_is_the_sum_of_its_ops_saved_tensors(card, assumptions):
    run = make(card, tp=2, ep=2 if load_model(card).is_moe else 1, precision="fp8", fp8_activations=True)
    g = shape_of(run, assumptions).graph
    for kind in _kinds(run):
        ops = layer_ops(run.model, g, kind)
        saved = [t for op in ops for t in op.saved]
        none = sum(op.saved_bytes for op in ops)
        assert layer_activation_bytes(run, kind, recompute="none", assumptions=assumptions) == none
        assert layer_activation_bytes(run, kind, recompute="selective", assumptions=assumptions) == pytest.approx(
            sum(t.bytes for t in saved if t.dropped_by != SELECTIVE), rel=1e-12)
        assert layer_activation_bytes(run, kind, recompute="full", assumptions=assumptions) == sum(
            t.bytes for t in saved if t.dropped_by == KEPT)


def test_module_tree_lists_each_op_saved_tensor_once_under_its_module():
    run = make("qwen3-30b-a3b", tp=2, ep=2)
    tree = module_tree(run, 0)
    layer = next(c for c in tree.children[0].children if c.name.startswith("moe_layer"))
    n = int(layer.name.split("x")[1])
    by_module: dict[str, list[tuple[str, float]]] = {}
    for op in layer_ops(run.model, shape_of(run).graph, "moe"):
        by_module.setdefault(module_of(op.name), []).extend((t.name, n * t.bytes) for t in op.saved)
    for mod in layer.children:
        assert [(c.name, c.activation_bytes) for c in mod.children] == by_module.pop(mod.name, [])
    assert not any(by_module.values())  # no op saves into a module the tree lacks


def _patched_layer_ops(monkeypatch, edit) -> None:
    """Route activations.py through an edited op graph (and drop the cached blocks both ways)."""
    original = activations.layer_ops

    def edited(card, s, kind, window=None):
        return [edit(op) for op in original(card, s, kind, window)]

    activations.clear_block_caches()
    monkeypatch.setattr(activations, "layer_ops", edited)


@pytest.fixture(autouse=True)
def _fresh_block_cache():
    activations.clear_block_caches()
    yield
    activations.clear_block_caches()


def test_adding_a_saved_tensor_to_an_op_adds_its_bytes(monkeypatch):
    run = make("llama3-8b", tp=2)
    before = {rc: layer_activation_bytes(run, "dense", recompute=rc) for rc in ("none", "selective", "full")}
    extra = Saved("extra", 12345.0)
    _patched_layer_ops(monkeypatch, lambda op: replace(op, saved=op.saved + (extra,)) if op.name == "mlp_act" else op)
    assert layer_activation_bytes(run, "dense", recompute="none") == before["none"] + 12345.0
    assert layer_activation_bytes(run, "dense", recompute="selective") == before["selective"] + 12345.0
    assert layer_activation_bytes(run, "dense", recompute="full") == before["full"]  # dropped by full recompute


def test_removing_the_logsumexp_from_core_attention_removes_what_selective_recompute_drops(monkeypatch):
    run = make("llama3-8b", tp=2)
    none, sel = (layer_activation_bytes(run, "dense", recompute=rc) for rc in ("none", "selective"))

    def drop_lse(op: Op) -> Op:
        if op.name != "attn_core":
            return op
        return replace(op, saved=tuple(t for t in op.saved if t.name != "softmax_lse"))

    _patched_layer_ops(monkeypatch, drop_lse)
    assert layer_activation_bytes(run, "dense", recompute="none") == sel
    assert layer_activation_bytes(run, "dense", recompute="selective") == sel
    assert none - sel == (32 / 2) * 1024 * FP32  # a/tp heads x T = 1024 tokens x fp32


def test_core_attention_saved_bytes_by_hand():
    # Llama 3 8B: a = 32 heads, g = 8 KV heads, d = 128; mbs 2 x seq 4096, TP 2 with SP
    run = make("llama3-8b", tp=2, mbs=2, seq_len=4096, gbs=16)
    core = next(op for op in layer_ops(run.model, shape_of(run).graph, "dense") if op.name == "attn_core")
    T = 2 * 4096
    assert {t.name: (t.bytes, t.dropped_by) for t in core.saved} == {
        "q": (T * 16 * 128 * BF16, "full"), "k": (T * 4 * 128 * BF16, "full"), "v": (T * 4 * 128 * BF16, "full"),
        "softmax_lse": (16 * T * FP32, SELECTIVE)}


def test_routed_expert_saved_bytes_by_hand_with_fp8_inputs():
    # Qwen3-30B-A3B: H = 2048, F_e = 768, top-8, SwiGLU; TP 2 + SP, EP 2, mbs 1 x seq 1024, FP8 saved inputs
    run = make("qwen3-30b-a3b", tp=2, ep=2, precision="fp8", fp8_activations=True, moe_imbalance=1.5)
    g = shape_of(run).graph
    ops = {op.name: op for op in layer_ops(run.model, g, "moe")}
    pairs = 1024 // 2 * 8 * 1.5  # SP shard x top-k x imbalance
    assert moe_pairs(run.model, g) == pairs
    assert [(t.name, t.bytes) for t in ops["experts_up"].saved] == [("expert_fc1_input", pairs * 2048 * FP8)]
    # fp8_activations is Megatron's activation_func_fp8_input_store: the SwiGLU input in FP8 too
    assert [(t.name, t.bytes) for t in ops["experts_act"].saved] == [
        ("expert_probs", pairs * FP32), ("fc1_output", pairs * 2 * 768 * FP8)]
    assert [(t.name, t.bytes) for t in ops["experts_down"].saved] == [("act_output", pairs * 768 * FP8)]
    # without it the SwiGLU input stays bf16, and TE keeps the GEMM inputs as its quantised FP8 copies anyway
    plain = make("qwen3-30b-a3b", tp=2, ep=2, precision="fp8", moe_imbalance=1.5)
    ops = {op.name: op for op in layer_ops(plain.model, shape_of(plain).graph, "moe")}
    assert [(t.name, t.bytes) for t in ops["experts_act"].saved][1] == ("fc1_output", pairs * 2 * 768 * BF16)
    assert [(t.name, t.bytes) for t in ops["experts_up"].saved] == [("expert_fc1_input", pairs * 2048 * FP8)]
    bw = make("qwen3-30b-a3b", tp=2, ep=2, precision="fp8", fp8_recipe="blockwise", moe_imbalance=1.5)
    ops = {op.name: op for op in layer_ops(bw.model, shape_of(bw).graph, "moe")}  # + an fp32 scale per 128
    assert [(t.name, t.bytes) for t in ops["experts_up"].saved] == [("expert_fc1_input", pairs * 2048 * (1 + 4 / 128))]


def test_embedding_and_head_blocks_are_shared_only_where_they_are_equal():
    """The embedding and output-head blocks are cached on what they read of a shape (``_edge_key``): for every
    shape of a sample of several spaces (MoE and dense, TP/CP/EP/MBS/precision/dispatcher, Megatron and TorchTitan
    eager and compiled) the cached block equals the one its builder makes for that shape, field by field."""
    from tests.oracle.test_compute_edges import edge_sample_runs

    activations.clear_block_caches()
    runs = edge_sample_runs()
    other = MemoryAssumptions(flash_attention=False, dropout=True, router_fp32=False)
    shapes = {shape_of(r): r for r in runs} | {shape_of(r, other): r for r in runs[::5]}
    keys = {activations._edge_key(s) for s in shapes}
    assert len(shapes) > 2 * len(keys) and len({k[3:] for k in keys}) >= 3  # shared often; 3 kernel kinds
    for s, r in shapes.items():
        card = r.model
        assert blocks(card, s).embedding == activations._embedding(card, s)
        assert blocks(card, s).head == activations._head(card, s, True)
        assert blocks(card, s).head_no_weight == activations._head(card, s, False)


def test_layer_blocks_are_shared_only_where_they_are_equal():
    """Shapes that differ only in what no block reads (``COMPUTE_ONLY_SHAPE_FIELDS``: precision of a GEMM or of
    attention, dispatcher, router / MLP fusion, weight-gradient traffic) share their blocks: for every shape of a
    sample of several spaces the shared layer block equals the one its builder makes for that shape, field by
    field (parameters, saved tensors and what each recompute mode drops), and some are shared."""
    from tests.oracle.test_compute_edges import edge_sample_runs

    activations.clear_block_caches()
    runs = edge_sample_runs() + [make("nemotron3-nano-30b-a3b", num_gpus=8, tp=2, ep=4, seq_len=4096, gbs=32,
                                      **kw) for kw in ({}, {"moe_a2a_backend": "deepep"}, {"precision": "fp8"},
                                                       {"moe_router_fusion": True})]
    other = MemoryAssumptions(flash_attention=False, dropout=True, router_fp32=False)
    shapes = {shape_of(r): r for r in runs} | {shape_of(r, other): r for r in runs[::5]}
    assert len(shapes) > len({(r.model, activations._memory_key(s)) for s, r in shapes.items()})
    for s, r in shapes.items():
        card = r.model
        for kind in set(card.layer_kinds):
            assert blocks(card, s).layer(kind) == activations._layer(card, s, kind), (card.name, kind)
