"""Hybrid Mamba-2 / Transformer models (Megatron-Core HybridModel: Nemotron-H, Nemotron 3): the layer pattern, the
Mamba-2 mixer's op graph, memory, FLOPs, CUDA-graph scopes, legality and the Hugging Face import."""
from __future__ import annotations

import json
from collections import Counter
from math import ceil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import DEFAULT, blocks, layer_activation_bytes, shape_of
from oracle.compute import LayerModel, price_op
from oracle.config import RunConfig
from oracle.cuda_graphs import layer_regions
from oracle.errors import BenchmarkError, InvalidConfigError
from oracle.flops import attention_flops_per_token, model_flops_per_token
from oracle.hf_import import card_from_hf_config
from oracle.layout import Layout
from oracle.memory import memory_peaks, project_memory
from oracle.model_card import ModelCard, load_model
from oracle.opgraph import BF16, GEMM, KEPT, MAMBA, SSD, Shapes, layer_ops, ssd_matmuls
from oracle.projector import comm_model, project, project_many

PATTERN_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def _run(model: str = "nemotronh-8b", hardware: str = "h100-sxm", num_gpus: int = 8, **training) -> RunConfig:
    training.setdefault("seq_len", 8192)
    training.setdefault("gbs", 64)
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hardware, "num_gpus": num_gpus},
                                "training": training})


def test_the_pattern_gives_one_layer_kind_per_symbol():
    card = load_model("nemotronh-8b")
    assert card.hybrid_pattern == PATTERN_8B and card.num_layers == len(PATTERN_8B)
    assert Counter(card.layer_kinds) == {"mamba": 24, "mlp": 24, "attention": 4}
    nano = load_model("nemotron3-nano-30b-a3b")
    assert Counter(nano.layer_kinds) == {"mamba": 23, "moe_mlp": 23, "attention": 6}
    # the active count leaves the untaken routed experts of every MoE layer out
    assert nano.total_params() - nano.active_params() == 23 * (128 - 6) * nano.mlp_params(nano.expert_ffn)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_mamba_gemms_are_the_in_and_out_projections_split_over_tp(tp):
    run = _run(tp=tp)
    card = run.model
    ops = layer_ops(card, Shapes.of(run), "mamba")
    gemms = {op.name: op for op in ops if op.kind == GEMM}
    assert set(gemms) == {"in_proj", "out_proj"}
    T = 8192
    d_in = card.mamba_heads * card.mamba_head_dim
    assert gemms["in_proj"].n * tp == 2 * d_in + 2 * card.mamba_num_groups * card.mamba_state_dim + card.mamba_heads
    assert sum(op.flops_f for op in gemms.values()) == 2 * T * card.mamba_gemm_params() / tp
    assert all(op.block == MAMBA for op in ops)


def test_the_scan_counts_the_chunked_matmuls_of_ssd():
    run = _run(tp=2, mbs=2)
    card = run.model
    ssd = next(op for op in layer_ops(card, Shapes.of(run), "mamba") if op.kind == SSD)
    q, n, p = card.mamba_chunk_size, card.mamba_state_dim, card.mamba_head_dim
    heads, groups = card.mamba_heads // 2, card.mamba_num_groups // 2
    chunks = 2 * ceil(8192 / q)  # mbs x chunks per sequence
    # per chunk: C B^T per group (Q x Q x N); per head B^T X (N x P x Q), (C B^T o L) X (Q x P x Q), C h (Q x P x N)
    want = 2 * chunks * (groups * q * q * n + heads * (n * p * q + q * p * q + q * p * n))
    assert ssd.flops_f == want
    assert sum(2 * g * m * nn * k for m, nn, k, g in ssd_matmuls(ssd)) == want
    f, b, w = price_op(run.cluster.hardware, ssd)
    assert 0 < f < b and w == 0.0


@pytest.mark.parametrize("kind", ["mamba", "attention", "mlp"])
def test_full_recompute_keeps_only_each_hybrid_layer_input(kind):
    run = _run(tp=2, sequence_parallel=True)
    block = blocks(run.model, shape_of(run)).layer(kind)
    layer_input = 8192 // 2 * run.model.hidden_size * BF16  # the sequence-parallel shard, bf16
    assert block.checkpoint_bytes == layer_input
    assert block.act("none") > block.checkpoint_bytes
    first = layer_ops(run.model, Shapes.of(run), kind)[0]
    assert first.saved[0].dropped_by == KEPT


def test_the_moe_only_layer_keeps_its_input_under_full_recompute():
    run = _run("nemotron3-nano-30b-a3b", tp=1, ep=8)
    block = blocks(run.model, shape_of(run)).layer("moe_mlp")
    assert block.checkpoint_bytes == 8192 * run.model.hidden_size * BF16
    assert block.params_expert == 128 / 8 * run.model.mlp_params(run.model.expert_ffn)


def test_the_mamba_layer_saves_what_the_fused_scan_keeps():
    run = _run(tp=1)
    card = run.model
    T, H = 8192, card.hidden_size
    d_in = card.mamba_heads * card.mamba_head_dim
    want = T * H * BF16 * 2 + T * card.mamba_in_proj_width * BF16 + 3 * T * d_in * BF16  # input, in_proj input,
    # zxBCdt; out_x, the norm's input, out_proj's input
    assert layer_activation_bytes(run, "mamba", recompute="none") == want


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2, 4]))
def test_recompute_never_raises_a_hybrid_model_activation_memory(tp, mbs):
    none = project_memory(_run(tp=tp, mbs=mbs, gbs=64 * mbs), trees="none").peak_bytes
    full = project_memory(_run(tp=tp, mbs=mbs, gbs=64 * mbs, recompute="full"), trees="none").peak_bytes
    sel = project_memory(_run(tp=tp, mbs=mbs, gbs=64 * mbs, recompute="selective"), trees="none").peak_bytes
    assert full <= sel <= none


def test_model_flops_count_mamba_scans_and_attention_only_in_their_layers():
    card = load_model("nemotronh-8b")
    s = 8192
    gemm = 24 * card.mamba_gemm_params() + 4 * card.attention_gemm_params() + 24 * card.mlp_gemm_params(
        card.ffn_hidden_size)
    attn = sum(attention_flops_per_token(card, s, i) for i, k in enumerate(card.layer_kinds) if k == "attention")
    scan = 24 * 7 * card.mamba_heads * card.mamba_head_dim * card.mamba_state_dim
    assert model_flops_per_token(card, s) == pytest.approx(
        3 * (2 * gemm + attn + scan + 2 * card.hidden_size * card.padded_vocab()), rel=1e-12)


def test_each_layer_kind_has_its_own_tp_pair_and_the_mamba_layer_no_cp_or_ep_traffic():
    run = _run("nemotron3-nano-30b-a3b", tp=2, ep=4)
    lm = LayerModel(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus))
    mamba, attn, moe = lm.layer("mamba"), lm.layer("attention"), lm.layer("moe_mlp")
    assert set(mamba.comm) == {"tp"} and set(attn.comm) == {"tp"}
    assert "ep_a2a" in moe.comm and "tp" in moe.comm  # the shared expert is a TP pair
    assert mamba.attn_f_s == 0.0 and attn.attn_f_s > 0.0


def test_cuda_graph_scopes_capture_the_hybrid_layers_they_name():
    t = _run(cuda_graph_impl="transformer_engine", cuda_graph_scope=["mamba", "attn"]).training
    assert layer_regions(t, "mamba") == (frozenset({MAMBA}),)
    assert layer_regions(t, "attention") == (frozenset({"attn"}),)
    assert layer_regions(t, "mlp") == ()
    with pytest.raises(InvalidConfigError, match="cuda_graph_scope 'mamba' captures Mamba layers; llama3-8b"):
        _run("llama3-8b", cuda_graph_impl="transformer_engine", cuda_graph_scope=["mamba"])


def test_projections_batch_and_memory_paths_agree_for_hybrid_runs():
    runs = [_run(tp=tp, pp=pp, mbs=mbs, recompute=rc, gbs=128)
            for tp in (1, 2) for pp in (1, 2) for mbs in (1, 2) for rc in ("none", "full")]
    runs.append(_run("nemotron3-nano-30b-a3b", tp=2, ep=4, pp=2, gbs=128))
    peaks, caps = memory_peaks(runs)
    for r, peak, cap in zip(runs, peaks, caps):
        m = project_memory(r, trees="none")
        assert peak == m.peak_bytes and cap == m.cap_bytes
    for r, p in zip(runs, project_many(runs, memory_tree=False)):
        assert p.to_dict() == project(r, memory_tree=False).to_dict()


def test_a_56b_projection_splits_its_time_and_memory():
    p = project(_run("nemotronh-56b", "b200", 64, tp=2, gbs=192, precision="fp8", fp8_recipe="tensorwise",
                     use_distributed_optimizer=True))
    assert p.tokens_per_s_per_gpu > 0 and 0 < p.mfu < 1
    kinds = {c.kind for c in p.breakdown.comm}
    assert "tp" in kinds and "dp_grad" in kinds
    tree = p.memory.stages[0].tree
    names = [c.name for c in tree.children[0].children]
    assert "mamba_layer x54" in names and "attention_layer x10" in names and "mlp_layer x54" in names


def test_context_parallelism_shards_the_scan_by_heads_between_two_all_to_alls():
    one, two = _run(num_gpus=16, tp=2, seq_len=32768, gbs=32), _run(num_gpus=16, tp=2, cp=2, seq_len=32768, gbs=32)
    ssd = [next(op for op in layer_ops(r.model, Shapes.of(r), "mamba") if op.kind == SSD) for r in (one, two)]
    assert ssd[0].s_q == ssd[1].s_q == 32768  # the whole sequence, half the heads
    assert ssd[1].batch_heads * 2 == ssd[0].batch_heads and ssd[1].flops_f * 2 == ssd[0].flops_f
    lm = LayerModel(Layout(two), comm_model(two.cluster.hardware, two.cluster.num_gpus))
    cp = lm.layer("mamba").comm["cp"]
    assert cp.f_total_s > 0 and cp.f_exposed_s == cp.f_total_s  # no overlap
    assert "cp" not in LayerModel(Layout(one), comm_model(one.cluster.hardware, 16)).layer("mamba").comm
    m1, m2 = (project_memory(r, trees="none").stages[0].activations_bytes for r in (one, two))
    assert m2 == pytest.approx(m1 / 2, rel=0.02)  # each rank saves half the tokens


def test_context_parallelism_needs_whole_heads_per_rank():
    card = {"based_on": "nemotronh-8b", "name": "nh-24-heads", "mamba_num_heads": 24}
    with pytest.raises(InvalidConfigError, match="cp must divide the heads"):
        RunConfig.from_dict({"model": card, "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
                             "training": {"cp": 16, "seq_len": 65536, "gbs": 16}})


@pytest.mark.parametrize("training,match", [
    (dict(tp=16), "must divide the 128 Mamba heads and the 8 Mamba groups"),
    (dict(framework="torchtitan", fsdp=True), "TorchTitan has no Mamba layer"),
])
def test_layouts_the_mamba_mixer_cannot_run_are_refused(training, match):
    with pytest.raises(InvalidConfigError, match=match):
        _run(num_gpus=16, **training)


def test_hybrid_pipeline_stages_are_an_even_split_first_last_counts_or_an_explicit_layout():
    with pytest.raises(InvalidConfigError, match="only from '\\|' separators in its layer pattern"):
        _run(num_gpus=16, pp=2, vpp=2)
    with pytest.raises(InvalidConfigError, match="not by these flags"):
        _run(num_gpus=16, pp=2, account_for_embedding_in_pipeline_split=True)
    assert project(_run(num_gpus=16, pp=2)).tokens_per_s_per_gpu > 0  # 26 layers a stage
    # '|' boundaries as a layout: 4 virtual stages of 13 layers
    layout = "E" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "L"
    assert project(_run(num_gpus=16, pp=2, vpp=2, pipeline_model_parallel_layout=layout)).tokens_per_s_per_gpu > 0


def test_a2a_overlap_on_a_hybrid_moe_is_refused():
    with pytest.raises(InvalidConfigError, match="not modelled for Mamba layers"):
        _run("nemotron3-nano-30b-a3b", ep=8, moe_a2a_overlap=True)


def _card(**changes) -> dict:
    base = dict(name="hy", num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=1000,
                ffn_hidden_size=512, hybrid_pattern="M*M-", mamba_num_heads=8, mamba_num_groups=2,
                mamba_state_dim=16)
    return {**base, **changes}


@pytest.mark.parametrize("changes,match", [
    (dict(hybrid_pattern="MD*-"), "symbol 'D' \\(DeepSeek sparse attention\\) is not modelled"),
    (dict(hybrid_pattern="M*M-M"), "5 layer symbols but num_layers=4"),
    (dict(hybrid_pattern="M*|M-"), "give the stages as training.pipeline_model_parallel_layout"),
    (dict(hybrid_pattern="M*ME"), "MoE layers \\(E\\) but num_experts=0"),
    (dict(ffn_hidden_size=None), "MLP layers \\(-\\) but no ffn_hidden_size"),
    (dict(mtp_shared_weights=True), "mtp_shared_weights=true needs MTP layers"),
    (dict(mamba_num_heads=6, mamba_num_groups=4), "mamba_num_heads=6 must be a multiple of mamba_num_groups=4"),
    (dict(mamba_head_dim=0), "mamba_head_dim=0 must be > 0"),
])
def test_a_hybrid_card_that_megatron_would_refuse_is_an_error(changes, match):
    with pytest.raises(InvalidConfigError, match=match):
        ModelCard.from_dict(_card(**changes))


def _hf(**changes) -> dict:
    base = {"model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
            "num_hidden_layers": 52, "hybrid_override_pattern": PATTERN_8B, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192, "mlp_hidden_act": "relu2",
            "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4,
            "chunk_size": 128, "tie_word_embeddings": False}
    return {**base, **changes}


@pytest.mark.parametrize("folder,bundled", [("nemotron-h-8b-base-8k", "nemotronh-8b"),
                                              ("nvidia-nemotron-3-nano-30b-a3b", "nemotron3-nano-30b-a3b")])
def test_the_config_json_fixtures_import_to_the_bundled_cards(folder, bundled):
    card = load_model(str(Path(__file__).parents[1] / "fixtures" / "hf" / folder / "config.json"))
    ref = load_model(bundled)
    assert card.name == folder and card.layer_kinds == ref.layer_kinds
    assert card.total_params() == ref.total_params() and card.active_params() == ref.active_params()


def test_a_nemotron_h_config_json_imports_to_the_bundled_card():
    card, bundled = card_from_hf_config(_hf(), "Nemotron-H-8B"), load_model("nemotronh-8b")
    assert card.layer_kinds == bundled.layer_kinds and card.total_params() == bundled.total_params()
    listed = _hf(layers_block_type=[{"M": "mamba", "*": "attention", "-": "mlp"}[c] for c in PATTERN_8B])
    del listed["hybrid_override_pattern"]
    assert card_from_hf_config(listed, "x").hybrid_pattern == PATTERN_8B


def test_a_nemotron_3_moe_config_json_imports_its_experts_and_its_latent_width():
    nano = load_model("nemotron3-nano-30b-a3b")
    data = _hf(hidden_size=2688, num_hidden_layers=52, hybrid_override_pattern=nano.hybrid_pattern,
               num_key_value_heads=2, mamba_num_heads=64, n_routed_experts=128, num_experts_per_tok=6,
               moe_intermediate_size=1856, n_shared_experts=1, moe_shared_expert_intermediate_size=3712)
    card = card_from_hf_config(data, "nano")
    assert card.total_params() == nano.total_params() and card.active_params() == nano.active_params()
    latent = card_from_hf_config({**data, "moe_latent_size": 1024}, "latent")
    assert latent.moe_latent_size == 1024 and latent.expert_width == 1024


LATENT = {"based_on": "nemotron3-nano-30b-a3b", "name": "nano-latent", "moe_latent_size": 1024}


def test_a_latent_moe_counts_its_experts_on_the_latent_width_and_its_two_projections():
    nano, latent = load_model("nemotron3-nano-30b-a3b"), ModelCard.from_dict(dict(LATENT))
    H, L, F = nano.hidden_size, 1024, nano.expert_ffn
    per_expert = lambda width: 2 * width * F  # noqa: E731  squared ReLU: up and down
    moe = 23  # MoE layers
    assert nano.total_params() - latent.total_params() == moe * (128 * (per_expert(H) - per_expert(L)) - 2 * H * L)
    # model FLOPs (Megatron-LM moe_layer_flops with a latent size: routed experts on it, + 4 T H latent)
    from oracle.flops import gemm_params_per_token
    assert gemm_params_per_token(latent, "moe_mlp") == (6 * per_expert(L) + H * 128 + 2 * H * L
                                                         + latent.mlp_gemm_params(latent.shared_ffn))


def test_a_latent_moe_dispatches_and_computes_on_the_latent_width():
    base = {"cluster": {"hardware": "b200", "num_gpus": 8},
            "training": {"ep": 8, "seq_len": 8192, "gbs": 64, "moe_a2a_backend": "alltoall"}}
    nano = RunConfig.from_dict({"model": "nemotron3-nano-30b-a3b", **base})
    latent = RunConfig.from_dict({"model": dict(LATENT), **base})
    ops = {op.name: op for op in layer_ops(latent.model, Shapes.of(latent), "moe_mlp")}
    assert ops["experts_up"].k == 1024 and ops["experts_down"].n == 1024
    assert (ops["latent_down"].k, ops["latent_down"].n) == (2688, 1024) and ops["latent_up"].n == 2688
    a2a = [LayerModel(Layout(r), comm_model(r.cluster.hardware, 8)).layer("moe_mlp").comm["ep_a2a"].f_total_s
           for r in (nano, latent)]
    assert a2a[1] < a2a[0] * (1024 / 2688) * 1.2  # the exchange moves latent-width tokens
    peaks, _ = memory_peaks([latent])
    assert peaks[0] == project_memory(latent, trees="none").peak_bytes
    assert project(latent).tokens_per_s_per_gpu > 0
    with pytest.raises(InvalidConfigError, match="shared-expert overlap with MoE latent projections"):
        RunConfig.from_dict({"model": dict(LATENT), **base, "training": {**base["training"],
                                                                         "moe_shared_expert_overlap": True}})


def test_benchmark_mode_says_it_cannot_build_a_mamba_layer():
    from oracle.benchmark.spec import run_layer_specs
    from oracle.scaling import downscale
    run = _run(tp=2)
    with pytest.raises(BenchmarkError, match="nemotronh-8b is a hybrid Mamba model .* use --mode simulate"):
        run_layer_specs(run, downscale(run, 1))


def test_a_hybrid_model_s_mtp_depths_and_their_shared_weights():
    """Megatron-Core's hybrid MTP (pattern attention + MoE per depth) as one transformer layer of the model's kind
    per depth; mtp_use_repeated_layer (mtp_shared_weights) runs one set of weights at every depth: the parameters
    once, the compute and the activations per depth."""
    nano = load_model("nemotron3-nano-30b-a3b")
    two, shared = nano.replace(mtp_layers=2), nano.replace(mtp_layers=2, mtp_shared_weights=True)
    assert two.mtp_params() == 2 * shared.mtp_params() > 0
    runs = [RunConfig.from_dict({"model": c.to_dict(), "cluster": {"hardware": "b200", "num_gpus": 8},
                                 "training": {"ep": 8, "seq_len": 4096, "gbs": 64}}) for c in (nano, two, shared)]
    (p0, p2, ps) = (project(r) for r in runs)
    assert p2.iteration_time_s > p0.iteration_time_s
    assert ps.iteration_time_s == pytest.approx(p2.iteration_time_s, rel=0.01)  # the same compute per depth
    m0, m2, ms = (p.memory.stages[0] for p in (p0, p2, ps))
    assert ms.params_bytes < m2.params_bytes and ms.activations_bytes == m2.activations_bytes
    assert m2.params_bytes - ms.params_bytes == pytest.approx(ms.params_bytes - m0.params_bytes, rel=0.02)
    data = json.loads((Path(__file__).parents[1] / "fixtures/hf/nvidia-nemotron-3-nano-30b-a3b/config.json").read_text())
    assert card_from_hf_config({**data, "num_nextn_predict_layers": 2}, "x").mtp_layers == 2
    odd = card_from_hf_config({**data, "num_nextn_predict_layers": 2, "mtp_layers_block_type": ["mamba"]}, "y")
    assert odd.mtp_layers == 0 and "not modelled" in odd.notes


def test_the_op_fuser_on_a_squared_relu_moe_takes_device_counts_but_no_cute_kernel():
    # Megatron-Core experts._is_fused_impl_supported: the TE op fuser also runs a weighted squared-ReLU expert MLP
    # (ScaledSReLU), but the CuTe DSL grouped MLP kernel is GLU-only: same kernels as unfused, no host sync with a
    # static HybridEP budget
    kw = dict(model="nemotron3-nano-30b-a3b", hardware="b200", num_gpus=8, ep=8, mbs=2, gbs=512,
              moe_a2a_backend="hybridep", moe_expert_rank_capacity_factor=1.5)
    fused, plain = _run(fused_grouped_mlp=True, **kw), _run(**kw)
    assert Shapes.of(fused).fused_mlp is False and fused.training.moe_static_dispatch
    assert not plain.training.moe_static_dispatch
    f, p = project(fused), project(plain)
    assert f.breakdown.compute_s == pytest.approx(p.breakdown.compute_s)
    assert f.iteration_time_s < p.iteration_time_s  # the host sync is gone
    gelu = {**load_model("tiny-moe").to_dict(), "activation": "gelu"}
    with pytest.raises(InvalidConfigError, match="needs a gated \\(GLU\\) or squared-ReLU expert MLP"):
        _run(model=gelu, hardware="b200", num_gpus=8, seq_len=4096, ep=8, fused_grouped_mlp=True)
