"""Gated DeltaNet layers and gated attention (Qwen3-Next: Megatron-Core GatedDeltaNet, attention_output_gate): the
card's pattern of (mixer, MLP) pairs, the GDN op graph and its pricing, parameters, FLOPs, memory, legality, CUDA
graphs and the Hugging Face import."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import DEFAULT, blocks, shape_of
from oracle.compute import gdn_recurrence_s, gdn_time_s, price_op
from oracle.config import RunConfig
from oracle.cuda_graphs import layer_regions
from oracle.errors import InvalidConfigError
from oracle.flops import model_flops_per_token
from oracle.hardware import load_hardware
from oracle.hf_import import card_from_hf_config
from oracle.layout import assignment_of
from oracle.model_card import load_model
from oracle.opgraph import ATTN, GDN, GEMM, Op, Shapes, gdn_kernels, layer_ops
from oracle.projector import project, project_many

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen3-next-80b-a3b" / "config.json"


def _run(hardware: str = "b200", num_gpus: int = 64, **training) -> RunConfig:
    training.setdefault("seq_len", 4096)
    training.setdefault("gbs", 1024)
    training.setdefault("ep", 64)
    return RunConfig.from_dict({"model": "qwen3-next-80b-a3b", "cluster": {"hardware": hardware,
                                                                            "num_gpus": num_gpus},
                                "training": training})


def test_the_card_is_three_gdn_layers_to_one_gated_attention_each_with_a_moe_block():
    card = load_model("qwen3-next-80b-a3b")
    assert card.num_layers == 96 and card.hybrid_pairs
    assert Counter(card.layer_kinds) == {"gdn": 36, "attention": 12, "moe_mlp": 48}
    assert card.hybrid_pattern[:8] == "GEGEGE*E"
    # in_proj: q, k (16 x 128 each), v, z (32 x 128 each), beta and alpha (one per value head)
    assert card.gdn_in_proj_width == 2 * 2048 + 2 * 4096 + 2 * 32
    # gated attention: the QKV projection also makes one gate per query channel
    assert card.qkv_width == 16 * 256 * 2 + 2 * 2 * 256
    assert card.attention_gemm_params() == 2048 * card.qkv_width + 16 * 256 * 2048


def test_the_gate_adds_its_weights_gemm_and_elementwise_pass_and_nothing_else():
    card = load_model("qwen3-next-80b-a3b")
    plain = replace(card, attention_output_gate=False)
    assert card.attention_params() - plain.attention_params() == 2048 * 16 * 256
    s = Shapes.of(_run())
    gated = {op.name: op for op in layer_ops(card, s, "attention")}
    ungated = {op.name: op for op in layer_ops(plain, s, "attention")}
    assert set(gated) - set(ungated) == {"attn_gate"}
    assert gated["qkv"].n - ungated["qkv"].n == 16 * 256
    assert gated["attn_gate"].saved_bytes == 4096 * 16 * 256 * 2  # the gate, kept for the sigmoid's backward


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_the_gdn_gemms_are_in_and_out_projections_split_over_tp_and_tagged_attention(tp):
    card = load_model("qwen3-next-80b-a3b")
    s = Shapes.of(_run(tp=tp, ep=8))
    ops = layer_ops(card, s, "gdn")
    gemms = {op.name: op for op in ops if op.kind == GEMM}
    assert set(gemms) == {"in_proj", "out_proj"}
    assert sum(op.flops_f for op in gemms.values()) == 2 * 4096 * card.gdn_gemm_params() / tp
    assert all(op.block == ATTN for op in ops)  # the GDN is a TransformerLayer's self-attention
    rule = next(op for op in ops if op.kind == GDN)
    assert rule.batch_heads == 32 // tp


def test_the_rules_flops_are_near_megatrons_count():
    """The chunked rule's matmuls against Megatron-LM's 4 x heads x dv^2 per token (its count leaves the triangular
    inverse and the chunk-local products out, so the chunked form does somewhat more)."""
    card = load_model("qwen3-next-80b-a3b")
    rule = next(op for op in layer_ops(card, Shapes.of(_run()), "gdn") if op.kind == GDN)
    megatron = 2 * 4 * 32 * 128 ** 2 * 4096
    assert 1.0 < rule.flops_f / megatron < 2.0


def test_the_recurrence_chain_binds_when_few_heads_fill_the_part():
    hw = load_hardware("b200")
    card = load_model("qwen3-next-80b-a3b")
    one = next(op for op in layer_ops(card, Shapes.of(_run(tp=8, ep=8)), "gdn") if op.kind == GDN)  # 4 heads
    many = replace(one, batch_heads=one.batch_heads * 64)
    # 8 blocks on 148 units walk side by side: 64x the blocks cost less than 64x the time (they fill the units),
    # and no less than the 8 blocks' walk
    assert gdn_recurrence_s(hw, one) <= gdn_recurrence_s(hw, many) < 64 * gdn_recurrence_s(hw, one)
    f_one, b_one, _ = gdn_time_s(hw, one)
    assert f_one >= gdn_recurrence_s(hw, one) and b_one >= 2 * gdn_recurrence_s(hw, one)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1024, 2048, 4096, 8192]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]))
def test_the_rule_costs_more_with_more_tokens_and_its_backward_more_than_its_forward(seq, mbs, tp):
    hw = load_hardware("h100-sxm")
    card = load_model("qwen3-next-80b-a3b")
    s = Shapes.of(_run(hardware="h100-sxm", tp=tp, ep=8, seq_len=seq, mbs=mbs, gbs=1024))
    rule = next(op for op in layer_ops(card, s, "gdn") if op.kind == GDN)
    f, b, w = price_op(hw, rule)
    f2, b2, _ = price_op(hw, replace(rule, s_q=2 * rule.s_q))
    assert 0 < f < b and w == 0.0
    assert f2 > f and b2 > b
    # every kernel's bytes are in the op's total
    assert rule.bytes_f == pytest.approx(rule.batch_heads * rule.s_q
                                         * sum(k.bytes_per_token_head for k in gdn_kernels(rule.d_qk, rule.d_v, rule.chunk)))


def test_model_flops_count_the_gdn_layers_as_megatron_lm_does():
    card = load_model("qwen3-next-80b-a3b")
    plain = replace(card, hybrid_pattern=card.hybrid_pattern.replace("G", "*"), attention_output_gate=False)
    # Megatron-LM gdn_layer_flops: 2 x (GEMMs + conv x (2 qk + v) + 4 x value heads x dv^2) per token and layer
    gdn = 2 * (card.gdn_gemm_params() + 4 * (2 * 2048 + 4096) + 4 * 32 * 128 ** 2)
    s = 4096
    attn = 2 * card.attention_gemm_params() + 2 * s * 16 * 512
    plain_attn = 2 * plain.attention_gemm_params() + 2 * s * 16 * 512
    assert model_flops_per_token(card, s) - model_flops_per_token(plain, s) == pytest.approx(
        3 * (36 * (gdn - plain_attn) + 12 * (attn - plain_attn)))


def test_gdn_parameters_split_with_the_heads_and_sum_to_the_card():
    run = _run(tp=4, ep=8)
    card = run.model
    b = blocks(card, shape_of(run, DEFAULT)).layer("gdn")
    # all but the two replicated norms (the input's, one value head's) split over the 4 TP ranks
    assert b.params == pytest.approx((card.gdn_layer_params() - 2048 - 128) / 4 + 2048 + 128)
    assert b.checkpoint_bytes == 4096 // 4 * 2048 * 2  # full recompute keeps the layer input (its SP shard)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]))
def test_memory_never_falls_with_a_larger_micro_batch(tp, mbs):
    small = project(_run(tp=tp, ep=8, mbs=mbs)).memory.peak_bytes
    large = project(_run(tp=tp, ep=8, mbs=2 * mbs)).memory.peak_bytes
    assert large >= small


def test_context_parallel_adds_its_all_to_alls_and_tp_must_divide_the_heads():
    base, cp = project(_run(ep=16)), project(_run(ep=16, cp=4))
    assert "cp" not in {c.kind for c in base.breakdown.comm}
    assert next(c for c in cp.breakdown.comm if c.kind == "cp").total_s > 0
    with pytest.raises(InvalidConfigError, match="tp=32 must divide the 16 key heads and the 32 value heads"):
        project(_run(tp=32, ep=2))
    with pytest.raises(InvalidConfigError, match="cp=32 with tp=1: Gated DeltaNet context parallelism"):
        project(_run(cp=32, ep=2))


def test_pipeline_stages_split_whole_transformer_layers_as_a_gpt_model():
    ok = project(_run(pp=2, vpp=4, ep=32, mbs=4))  # 48 layers over 8 virtual stages: 6 each
    assert ok.tokens_per_s_per_gpu > 0
    with pytest.raises(InvalidConfigError, match=r"counted in its 48 transformer layers\): num_layers=48 is not "
                                                 r"divisible by pp\*vpp = 32"):
        project(_run(pp=32, ep=2))  # 96 symbols / 32 = 3 would start a stage at a MoE block: not a split
    # the layout keys count transformer layers, as Megatron's do (Megatron-Bridge's GB200 recipe's layout)
    lay = _run(pp=4, vpp=2, ep=16, pipeline_model_parallel_layout="Et*4|(t*7|)*5t*8|tmL")
    stages = assignment_of(lay).stages
    assert [len(s.layers) for s in stages] == [8, 14, 14, 14, 14, 14, 16, 2]  # pattern positions, two a layer
    assert stages[-1].mtp == 1 and stages[-1].loss
    first_last = assignment_of(_run(pp=4, ep=16, decoder_first_pipeline_num_layers=10,
                                    decoder_last_pipeline_num_layers=14)).stages
    assert [len(s.layers) for s in first_last] == [20, 24, 24, 28]


def test_cuda_graph_scope_attn_captures_the_gdn_mixer():
    t = _run(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"]).training
    assert layer_regions(t, "gdn") == (frozenset({ATTN}),)


def test_the_batch_path_agrees_with_the_scalar_path():
    runs = [_run(ep=e, mbs=m) for e in (16, 32, 64) for m in (1, 2)]
    for one, many in zip((project(r) for r in runs), project_many(runs)):
        assert many.tokens_per_s_per_gpu == one.tokens_per_s_per_gpu
        assert many.memory.peak_bytes == one.memory.peak_bytes


def test_the_hugging_face_config_imports_as_the_bundled_card():
    card = card_from_hf_config(json.loads(FIXTURE.read_text()), "qwen3-next-80b-a3b")
    bundled = load_model("qwen3-next-80b-a3b")
    assert card.hybrid_pattern == bundled.hybrid_pattern and card.hybrid_pairs and card.attention_output_gate
    # the published config.json names no MTP depth; the bundled card has the recipe's one
    assert card.total_params() == bundled.total_params()
    assert card.mtp_layers == 0 and bundled.mtp_layers == 1


@pytest.mark.parametrize("change,match", [
    ({"layer_types": ["linear_attention", "sliding"]}, "layer_types entries 'sliding' are not one of"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types lists 3 layers but num_hidden_layers=48"),
    ({"linear_num_value_heads": 24}, "gdn_num_value_heads=24 must be a multiple of gdn_num_key_heads=16"),
    ({"linear_num_key_heads": "16"}, "linear_num_key_heads='16' must be a number"),
])
def test_a_broken_qwen3_next_config_is_one_clear_error(change, match):
    data = {**json.loads(FIXTURE.read_text()), **change}
    with pytest.raises(InvalidConfigError, match=match):
        card_from_hf_config(data, "broken")


def test_a_pair_pattern_that_is_not_pairs_is_refused():
    card = load_model("qwen3-next-80b-a3b")
    with pytest.raises(InvalidConfigError, match="hybrid_pairs=true needs the pattern as"):
        RunConfig.from_dict({"model": {**card.to_dict(), "hybrid_pattern": "EG" * 48},
                             "cluster": {"hardware": "b200", "num_gpus": 8}, "training": {"ep": 8}})


QWEN35_TEXT = {  # transformers 5.12 Qwen3_5MoeTextConfig defaults (its docstring: "Qwen3.5-35B-A3B style")
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8,
    "num_experts": 256}


def test_qwen3_5_imports_as_its_language_model():
    # Qwen3.5 (transformers qwen3_5_moe): a vision-language wrapper whose text_config is a Qwen3NextConfig with
    # every layer MoE; the language model is the card, the vision encoder is said not to be priced
    wrapped = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
               "text_config": QWEN35_TEXT, "vision_config": {"depth": 27, "hidden_size": 1152}}
    card = card_from_hf_config(wrapped, "qwen3.5-35b-a3b")
    assert card.family == "qwen3_5_moe_text" and card.hybrid_pairs and card.attention_output_gate
    assert card.hybrid_pattern == ("GE" * 3 + "*E") * 10
    assert card.total_params() == pytest.approx(35e9, rel=0.02) and card.active_params() < 4e9
    assert "vision encoder is not priced" in card.notes
    run = RunConfig.from_dict({"model": card.to_dict(), "cluster": {"hardware": "b200", "num_gpus": 8},
                               "training": {"seq_len": 4096, "gbs": 64, "ep": 8}})
    assert project(run).tokens_per_s_per_gpu > 0
    # the dense Qwen3.5 (qwen3_5 / qwen3_5_text): the same mixers, a dense MLP in every layer
    dense_text = {k: v for k, v in QWEN35_TEXT.items() if "expert" not in k and k != "moe_intermediate_size"}
    dense = card_from_hf_config({"model_type": "qwen3_5", "text_config": {**dense_text, "intermediate_size": 6144}},
                                "qwen3.5-dense")
    assert not dense.is_moe and dense.hybrid_pattern == ("G-" * 3 + "*-") * 10 and dense.ffn_hidden_size == 6144
