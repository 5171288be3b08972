"""The kernel model (oracle.gemm), the op graph (oracle.opgraph) and the layer pricing (oracle.compute)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.flops import attention_flops_per_token, gemm_params_per_token, model_flops_per_token
from oracle.gemm import gemm_time_s, memory_bound_time_s
from oracle.hardware import load_hardware
from oracle.layout import Layout
from oracle.model_card import load_model
from oracle.opgraph import BF16, GEMM, MEMORY, Shapes, avg_keys, embedding_ops, forward_flops, layer_ops, output_ops
from oracle.projector import comm_model, project


def _run(model: str, hw: str = "h100-sxm", n: int = 8, **training) -> RunConfig:
    tr = {"seq_len": 4096, "gbs": 64, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": tr})


def _layer_model(run: RunConfig) -> LayerModel:
    return LayerModel(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus))


# ---------------------------------------------------------------- op graph: FLOPs and bytes
@pytest.mark.parametrize("model", ["llama3-8b", "llama2-70b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"])
def test_op_graph_gemm_flops_are_the_closed_form_count(model):
    """Per token, the GEMM FLOPs the op graph runs in one layer are 2 x the weights a token touches
    (6N with the backward); for MoE that is the top-k experts + router (the active parameters)."""
    card = load_model(model)
    run = _run(model, n=8, ep=8 if card.is_moe and card.num_experts % 8 == 0 else 1)
    s = Shapes.of(run)
    for kind in sorted(set(card.layer_kinds)):
        ops = layer_ops(card, s, kind)
        gemm = sum(op.flops_f for op in ops if op.kind == GEMM)
        per_token = gemm / s.T
        expected = 2.0 * gemm_params_per_token(card, kind)
        if kind == "moe":  # busiest-rank experts see pairs/E_local tokens each: E_local x that = topk x T
            expected_total = expected * s.T
            assert gemm == pytest.approx(expected_total, rel=1e-3)
        else:
            assert per_token == pytest.approx(expected, rel=1e-9)


def test_op_graph_attention_flops_are_the_causal_half_of_the_published_convention():
    card = load_model("llama3-8b")
    run = _run("llama3-8b")
    s = Shapes.of(run)
    att = [op for op in layer_ops(card, s, "dense") if op.name == "attn_core"][0]
    full = attention_flops_per_token(card, s.seq_len, 0) * s.T  # non-causal convention (Megatron/NeMo)
    assert att.flops_f == pytest.approx(full * avg_keys(s.seq_len, None) / s.seq_len, rel=1e-12)


def test_whole_model_flops_match_the_formula_with_non_causal_attention():
    card = load_model("llama3-8b")
    run = _run("llama3-8b")
    s = Shapes.of(run)
    fwd = 0.0
    for i, kind in enumerate(card.layer_kinds):
        ops = layer_ops(card, s, kind)
        fwd += sum(op.flops_f for op in ops if op.kind == GEMM)
        fwd += attention_flops_per_token(card, s.seq_len, i) * s.T
    fwd += forward_flops(output_ops(card, s, card.padded_vocab(), True))
    assert 3 * fwd / s.T == pytest.approx(model_flops_per_token(card, s.seq_len), rel=1e-9)


def test_memory_bound_op_bytes_match_a_hand_count():
    card = load_model("llama3-8b")  # H = 4096, F = 14336
    run = _run("llama3-8b", mbs=2, tp=2)
    s = Shapes.of(run)
    ops = {op.name: op for op in layer_ops(card, s, "dense")}
    T, Tsp, H = 2 * 4096, 2 * 4096 // 2, 4096
    assert ops["attn_residual"].bytes_f == BF16 * 3 * Tsp * H  # read x and residual, write the sum (SP shard)
    assert ops["attn_norm"].bytes_f == BF16 * 2 * Tsp * H
    assert ops["mlp_act"].bytes_f == BF16 * T * (14336 // 2) * 3  # SwiGLU: read gate+up, write
    emb = embedding_ops(card, s)[0]
    assert emb.kind == MEMORY and emb.bytes_f == BF16 * 2 * Tsp * H


def test_fp8_and_nvfp4_add_quantise_ops_and_lower_precision_gemms():
    card = load_model("llama3-8b")
    for prec, dtype in (("fp8", "fp8"), ("nvfp4", "fp4")):
        s = Shapes.of(_run("llama3-8b", hw="b200", precision=prec))
        ops = layer_ops(card, s, "dense")
        assert {op.dtype for op in ops if op.kind == GEMM} == {dtype}
        assert any(op.name.endswith("_quant") for op in ops)
    s = Shapes.of(_run("llama3-8b"))
    assert not any(op.name.endswith("_quant") for op in layer_ops(card, s, "dense"))


# ---------------------------------------------------------------- GEMM kernel model
HW = ["h100-sxm", "b200", "gb300-nvl72", "mi355x"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(hw=st.sampled_from(HW), m=st.integers(1, 6000), j=st.integers(2, 16), n=st.sampled_from([256, 768, 1536, 4096, 7168]),
       k=st.sampled_from([512, 2048, 4096, 7168]), groups=st.sampled_from([1, 4, 8, 16, 32, 128]),
       dtype=st.sampled_from(["bf16", "fp8"]))
def test_grouped_gemm_with_fewer_tokens_per_expert_is_never_faster_per_token(hw, m, j, n, k, groups, dtype):
    """Tile/wave quantisation, the launch floor and operand traffic all favour more tokens per group:
    per token, m tokens per expert never beats j x m (the regime of fine-grained MoE at small batch)."""
    h = load_hardware(hw)
    small = gemm_time_s(h, m, n, k, dtype, groups) / m
    large = gemm_time_s(h, j * m, n, k, dtype, groups) / (j * m)
    assert large <= small * (1 + 1e-12)


def test_grouped_gemms_run_in_batches_of_the_streams_transformer_engine_uses():
    """TE GroupedLinear: one GEMM per group on GROUPED_GEMM_STREAMS concurrent streams. A batch of
    that many groups shares its waves; the batches follow one another; more groups never cost less
    per group, and every batch is at least as fast as its groups run one by one."""
    from oracle.gemm import GROUPED_GEMM_STREAMS as S

    fitted = load_hardware("b200")
    # the stream batching alone: grouped GEMMs at the dense kernels' efficiency (efficiency.gemm_grouped = 1), no
    # per-batch kernel overhead
    h = dataclasses.replace(fitted, efficiency=dataclasses.replace(fitted.efficiency, gemm_grouped=1.0,
                                                                   grouped_gemm_overhead_s=0.0))
    m, n, k = 1024, 4096, 7168  # a DeepSeek-V3 expert fc1 at EP 8, MBS 1: 128 tiles on 148 SMs
    # the fitted grouped efficiency scales grouped calls only
    assert gemm_time_s(fitted, m, n, k, "fp8", 1) == gemm_time_s(h, m, n, k, "fp8", 1)
    assert gemm_time_s(fitted, m, n, k, "fp8", 8) >= gemm_time_s(h, m, n, k, "fp8", 8)
    one = gemm_time_s(h, m, n, k, "fp8", 1)
    batch = gemm_time_s(h, m, n, k, "fp8", S)
    assert gemm_time_s(h, m, n, k, "fp8", 8 * S) == pytest.approx(8 * batch)
    assert gemm_time_s(h, m, n, k, "fp8", 8 * S + 1) >= (8 * batch + one) * (1 - 1e-12)  # one tile shape for all
    assert batch <= S * one
    for g in (1, 2, 3, S, S + 1, 2 * S, 32, 33):
        assert gemm_time_s(h, m, n, k, "fp8", g + 1) >= gemm_time_s(h, m, n, k, "fp8", g)
    # 32 local experts lose the tail packing one GEMM of all their tokens gets (32 vs 28 waves here)
    assert gemm_time_s(h, m, n, k, "fp8", 32) > 1.1 * gemm_time_s(h, 32 * m, n, k, "fp8", 1)


def test_small_m_gemms_run_far_below_the_large_gemm_rate():
    """A 256-token expert GEMM runs at a fraction of a large GEMM's FLOP rate (tiles underfill the SMs)."""
    fitted = load_hardware("b200")
    h = dataclasses.replace(fitted, efficiency=dataclasses.replace(fitted.efficiency, grouped_gemm_overhead_s=0.0))
    rate = lambda m, n, k, g, hw=h: 2 * m * n * k * g / gemm_time_s(hw, m, n, k, "fp8", g)  # noqa: E731
    assert rate(256, 1536, 2048, 1) < 0.25 * rate(16384, 8192, 8192, 1)
    assert rate(256, 1536, 2048, 16) > rate(256, 1536, 2048, 1)  # grouping fills the waves
    # the per-batch kernel overhead (4 batches of 4 here) is paid on top
    over = fitted.efficiency.grouped_gemm_overhead_s
    assert gemm_time_s(fitted, 256, 1536, 2048, "fp8", 16) == pytest.approx(
        gemm_time_s(h, 256, 1536, 2048, "fp8", 16) + 4 * over, rel=1e-12)


def test_wgrad_gemms_accumulate_into_the_gradient_buffer_of_its_dtype():
    """Megatron's wgrad GEMM reads and writes the main-gradient buffer (gradient-accumulation fusion,
    2 x its dtype per weight element); TorchTitan writes a bf16 gradient once. A short reduction (few
    tokens) makes it bound by that traffic: the hand count."""
    h = load_hardware("b200")
    e_hbm = h.hbm_bandwidth_bytes_per_s * h.efficiency.hbm
    W, tok = 8192, 64  # an 8192 x 8192 weight's gradient over 64 tokens (fp8 operands)
    hand = (W * tok * 2 * 1.0 + W * W * 8) / e_hbm
    assert gemm_time_s(h, W, W, tok, "fp8", 1, False, 8.0) == pytest.approx(hand, rel=1e-12)
    assert gemm_time_s(h, W, W, tok, "fp8", 1, False, 4.0) < hand
    walls = {}
    for fp32, titan in ((False, False), (True, False), (True, True)):
        extra = {"framework": "torchtitan", "fsdp": True, "use_distributed_optimizer": False} if titan else {}
        run = _run("qwen3-30b-a3b", hw="b200", gbs=512, mbs=1, ep=8, precision="fp8",
                   grad_reduce_in_fp32=fp32, **extra)
        ops = layer_ops(run.model, Shapes.of(run), "moe") + output_ops(run.model, Shapes.of(run), 151936, True)
        trainable = [o for o in ops if o.kind == GEMM and o.has_wgrad]
        assert {o.wgrad_c_bytes for o in trainable} == {2 if titan else 8 if fp32 else 4}
        op = next(o for o in trainable if o.name == "experts_down")
        w = _layer_model(run).price(op)[2]
        assert w == gemm_time_s(h, op.k, op.n, op.m, op.dtype, op.groups, op.fused_groups, op.wgrad_c_bytes)
        walls[(fp32, titan)] = w
    assert walls[(False, False)] <= walls[(True, False)]
    # forward and dgrad never touch the gradient buffer
    lm32 = _layer_model(_run("qwen3-30b-a3b", hw="b200", gbs=512, mbs=1, ep=8, precision="fp8", grad_reduce_in_fp32=True))
    lm16 = _layer_model(_run("qwen3-30b-a3b", hw="b200", gbs=512, mbs=1, ep=8, precision="fp8"))
    a, b = lm32.layer("moe"), lm16.layer("moe")
    assert a.f_s == b.f_s and a.b_s == b.b_s and a.w_s >= b.w_s


def test_memory_bound_time_is_bytes_over_achievable_bandwidth_with_a_launch_floor():
    h = load_hardware("h100-sxm")
    nbytes = 1e9
    assert memory_bound_time_s(h, nbytes) == pytest.approx(nbytes / (h.hbm_bandwidth_bytes_per_s * h.efficiency.hbm))
    assert memory_bound_time_s(h, 10.0, kernels=3) == pytest.approx(3 * h.efficiency.kernel_launch_s)


# ---------------------------------------------------------------- host-bound passes
def _with_host(run: RunConfig, host_op_s: float) -> RunConfig:
    hw = run.cluster.hardware
    hw2 = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, host_op_s=host_op_s))
    return dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, hardware=hw2))


def test_a_slow_host_makes_small_moe_layers_host_bound_and_larger_micro_batches_pay_off():
    run = _run("qwen3-30b-a3b", hw="b200", gbs=512, mbs=1, ep=8, precision="fp8")
    fast = _layer_model(_with_host(run, 1e-6)).layer("moe")
    slow = _layer_model(_with_host(run, 2e-4)).layer("moe")
    assert fast.f_s == pytest.approx(slow.f_s) and fast.b_s == pytest.approx(slow.b_s)  # device time unchanged
    assert slow.host_f_s > fast.host_f_s and slow.host_b_s > 0.0
    # per token, a host-bound model gains from a larger micro-batch far more than a device-bound one
    gain = {}
    for h in (1e-6, 2e-4):
        tps = [project(_with_host(dataclasses.replace(run, training=run.training.replace(mbs=mbs)), h)).tokens_per_s_per_gpu
               for mbs in (1, 4)]
        gain[h] = tps[1] / tps[0]
    assert gain[2e-4] > gain[1e-6] > 0.9


def test_a_dense_layer_issues_fewer_host_ops_than_an_moe_layer():
    card = load_model("qwen3-30b-a3b")
    s = Shapes.of(_run("qwen3-30b-a3b", ep=8))
    dense_like = load_model("llama3-8b")
    n_moe = sum(op.host_ops for op in layer_ops(card, s, "moe"))
    n_dense = sum(op.host_ops for op in layer_ops(dense_like, Shapes.of(_run("llama3-8b")), "dense"))
    assert n_moe > 1.5 * n_dense


# ---------------------------------------------------------------- NVFP4
def test_nvfp4_is_faster_than_fp8_on_blackwell_and_caches_smaller_weight_copies():
    fp8 = project(_run("llama3-8b", hw="b200", gbs=128, precision="fp8"))
    fp4 = project(_run("llama3-8b", hw="b200", gbs=128, precision="nvfp4"))
    assert fp4.tokens_per_s_per_gpu > fp8.tokens_per_s_per_gpu
    d8, d4 = str(fp8.memory.to_dict()), str(fp4.memory.to_dict())
    assert "fp4_weight_cache" in d4 and "fp8_weight_cache" in d8 and "fp8_weight_cache" not in d4
    assert fp4.memory.peak_bytes < fp8.memory.peak_bytes


def test_nvfp4_on_a_part_without_fp4_is_a_clear_error():
    with pytest.raises(InvalidConfigError, match="nvfp4 needs FP4"):
        _run("llama3-8b", hw="h100-sxm", precision="nvfp4")


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000),
       dtype=st.sampled_from(["bf16", "fp8", "mxfp8", "fp4"]), groups=st.sampled_from([1, 3, 8, 16]),
       hw=st.sampled_from(["h100-sxm", "b200", "gb300-nvl72", "mi355x"]))
def test_a_gemm_that_is_not_whole_tiles_is_never_faster_per_flop_than_rounded_up(m, n, k, dtype, groups, hw):
    """Tile and K-step quantisation: the kernel runs whole tiles, so a GEMM whose sizes are not whole tiles does the
    rounded GEMM's work (and its shorter reduction fills the pipeline no better): per FLOP it is never faster than
    the same GEMM rounded up to the tile it runs with."""
    from math import ceil

    from oracle.gemm import gemm_tile
    h = load_hardware(hw)
    tm, tn, tk = gemm_tile(h, m, n, k, dtype, groups)
    up = (ceil(m / tm) * tm, ceil(n / tn) * tn, ceil(k / tk) * tk)
    per_flop = gemm_time_s(h, m, n, k, dtype, groups) / (m * n * k)
    per_flop_up = gemm_time_s(h, *up, dtype, groups) / (up[0] * up[1] * up[2])
    assert per_flop >= per_flop_up * (1 - 1e-12)
