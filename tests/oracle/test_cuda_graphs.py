"""CUDA graphs (Megatron-Core --cuda-graph-impl / --cuda-graph-scope): what is captured, what it saves
(host time only), what it costs (static buffers), and what Megatron and the physics refuse
(the exports: tests/raytune_primus/test_export.py)."""
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.cuda_graphs import GRAPH_REPLAY_HOST_OPS, STATIC_BUFFERS_PER_REGION, layer_regions
from oracle.errors import InvalidConfigError
from oracle.layout import Layout
from oracle.opgraph import ATTN, EXPERTS, MLP, ROUTER, Shapes, layer_ops
from oracle.projector import comm_model, project

QWEN3 = dict(seq_len=4096, gbs=512, ep=8, precision="fp8")
DROP_AND_PAD = dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
TE = "transformer_engine"


def run_of(model="qwen3-30b-a3b", hw="b200", n=8, **t):
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": t})


def slow_host(run, factor: float = 4.0):
    """``run`` on its part with a host ``factor`` x slower per framework op: a pass that is host-bound whatever the
    fitted constants (what graphs save is host time, so the tests need a host that binds)."""
    hw = run.cluster.hardware
    eff = dataclasses.replace(hw.efficiency, host_op_s=hw.efficiency.host_op_s * factor)
    return dataclasses.replace(run, cluster=dataclasses.replace(run.cluster,
                                                                 hardware=dataclasses.replace(hw, efficiency=eff)))


def layer(run, kind="moe"):
    return LayerModel(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus)).layer(kind)


def _buffers(p) -> float:
    return dict(p.memory.stages[0].other_breakdown).get("cuda_graph_buffers", 0.0)


def test_every_layer_op_belongs_to_one_block():
    for model, kind, blocks in (("llama3-8b", "dense", {ATTN, MLP}), ("qwen3-30b-a3b", "moe", {ATTN, ROUTER, EXPERTS})):
        run = run_of(model, **{**QWEN3, "ep": 8 if kind == "moe" else 1})
        ops = layer_ops(run.model, Shapes.of(run), kind)
        assert {op.block for op in ops} == blocks
        assert [op.block for op in ops if op.block == ATTN] == [ATTN] * sum(1 for op in ops if op.block == ATTN)
        if kind == "moe":  # the router block is what runs before the dispatcher's sync
            assert {op.name for op in ops if op.block == ROUTER} == {"mlp_norm", "router", "router_topk"}
            assert all(op.segment == 0 for op in ops if op.block == ROUTER)


def test_scopes_map_to_regions():
    t = run_of(mbs=1, cuda_graph_impl=TE, cuda_graph_scope=["attn", "moe_router", "moe_preprocess"], **QWEN3).training
    assert layer_regions(t, "moe") == (frozenset({ATTN}), frozenset({ROUTER}))
    t = run_of(mbs=1, cuda_graph_impl=TE, **QWEN3, **DROP_AND_PAD).training
    assert layer_regions(t, "moe") == (frozenset({ATTN, ROUTER, EXPERTS}),)  # empty scope: the whole layer
    t = run_of("llama3-8b", ep=1, seq_len=4096, gbs=512, cuda_graph_impl="local", cuda_graph_scope=["attn", "mlp"]).training
    assert layer_regions(t, "dense") == (frozenset({ATTN}), frozenset({MLP}))
    assert layer_regions(run_of(mbs=1, **QWEN3).training, "moe") == ()


def test_graphs_save_the_host_time_of_a_host_bound_moe_layer_and_leave_the_device_alone():
    """Qwen3-30B-A3B at MBS 1 on B200 is host-bound: capturing attention and the router removes their host
    ops (each graph replay costs its callable's two ops instead); the GPU's work is unchanged."""
    eager = slow_host(run_of(mbs=1, **QWEN3))
    graphed = slow_host(run_of(mbs=1, cuda_graph_impl=TE, cuda_graph_scope=["attn", "moe_router"], **QWEN3))
    a, b = layer(eager), layer(graphed)
    assert (b.f_s, b.b_s, b.w_s) == (a.f_s, a.b_s, a.w_s) and b.comm == a.comm
    assert b.host_f_s < a.host_f_s and b.host_b_s < a.host_b_s
    # the host time removed is exactly the captured ops' issue time, less two ops per replay
    lm = LayerModel(Layout(eager), comm_model(eager.cluster.hardware, 8))
    h = eager.cluster.hardware.efficiency.host_op_s
    captured_b = sum(lm.host_s(op)[1] for op, *_ in a.ops if op.block in (ATTN, ROUTER))
    host_b = lambda c: c.host_b_s + (c.b_s + c.w_s + sum(p.b_exposed_s for p in c.comm.values()))  # noqa: E731
    assert host_b(a) - host_b(b) == pytest.approx(captured_b - 2 * GRAPH_REPLAY_HOST_OPS * h, rel=1e-9)
    pe, pg = project(eager), project(graphed)
    assert pg.tokens_per_s_per_gpu > 1.3 * pe.tokens_per_s_per_gpu
    assert pg.breakdown.compute_s == pytest.approx(pe.breakdown.compute_s)


def test_a_device_bound_dense_model_gains_nothing_and_pays_the_static_buffers():
    base = dict(seq_len=8192, gbs=128, mbs=1, precision="fp8")
    eager = project(run_of("llama3-8b", hw="h100-sxm", **base))
    graphed = project(run_of("llama3-8b", hw="h100-sxm", cuda_graph_impl=TE, **base))
    assert graphed.tokens_per_s_per_gpu == pytest.approx(eager.tokens_per_s_per_gpu)
    # one whole-layer region per layer, one micro-batch in flight (pp 1): 2 x T x H bf16 per layer
    assert _buffers(graphed) == pytest.approx(STATIC_BUFFERS_PER_REGION * 32 * 8192 * 4096 * 2)
    assert graphed.memory.peak_bytes == pytest.approx(eager.memory.peak_bytes + _buffers(graphed))
    whole = project(run_of("llama3-8b", hw="h100-sxm", cuda_graph_impl="local", cuda_graph_scope=["full_iteration"],
                           **base))
    assert _buffers(whole) == 0.0 and whole.memory.peak_bytes == eager.memory.peak_bytes


def test_static_buffers_follow_the_micro_batches_in_flight():
    t = dict(seq_len=4096, gbs=64, mbs=1, tp=1, cp=1, cuda_graph_impl=TE, cuda_graph_scope=["attn"])
    one = project(run_of("llama3-8b", hw="h100-sxm", pp=1, **t))
    four = project(run_of("llama3-8b", hw="h100-sxm", pp=4, **t))
    # rank 0 of a 1F1B pipeline of 4 holds 4 micro-batches of its 8 layers: the same bytes as 32 layers x 1
    assert _buffers(four) == pytest.approx(_buffers(one))


def test_the_whole_moe_layer_is_captured_only_with_static_shapes():
    """Token-drop with padding has static shapes and no dispatcher sync: the whole layer is one graph and the
    host-bound pass runs at the device's pace; dropless cannot be captured past the router."""
    with pytest.raises(InvalidConfigError, match="cannot hold that sync"):
        run_of(mbs=1, cuda_graph_impl=TE, **QWEN3)
    with pytest.raises(InvalidConfigError, match="cannot hold that sync"):
        run_of(mbs=1, cuda_graph_impl=TE, cuda_graph_scope=["moe"], **QWEN3)
    padded = project(slow_host(run_of(mbs=1, **QWEN3, **DROP_AND_PAD), 8.0))
    whole = project(slow_host(run_of(mbs=1, cuda_graph_impl=TE, **QWEN3, **DROP_AND_PAD), 8.0))
    assert padded.breakdown.host_sync_s > 0.0 and whole.breakdown.host_sync_s == 0.0
    assert whole.tokens_per_s_per_gpu > 2 * padded.tokens_per_s_per_gpu


@pytest.mark.parametrize("training, named", [
    (dict(cuda_graph_scope=["attn"]), "needs cuda_graph_impl=local or transformer_engine"),
    (dict(cuda_graph_impl=TE, cuda_graph_scope=["full_iteration"], **DROP_AND_PAD), "needs cuda_graph_impl=local"),
    (dict(cuda_graph_impl="local", cuda_graph_scope=["full_iteration", "attn"], **DROP_AND_PAD),
     "combines with no other scope"),
    (dict(cuda_graph_impl=TE, cuda_graph_scope=["attn", "attn"]), "lists a scope twice"),
    (dict(cuda_graph_impl=TE, cuda_graph_scope=["mlp"]), "has MoE layers only"),
    (dict(cuda_graph_impl="local", cuda_graph_scope=["full_iteration"]), "cannot hold that sync"),
    (dict(cuda_graph_impl="sometimes"), "cuda_graph_impl"),
    (dict(cuda_graph_impl=TE, cuda_graph_scope=["experts"]), "is not one of"),
])
def test_impossible_graph_settings_are_named(training, named):
    with pytest.raises(InvalidConfigError, match=named):
        run_of(mbs=1, **QWEN3, **training)


def test_dense_models_refuse_moe_scopes_and_torchtitan_refuses_graphs():
    with pytest.raises(InvalidConfigError, match="needs a MoE model"):
        run_of("llama3-8b", seq_len=4096, gbs=64, cuda_graph_impl=TE, cuda_graph_scope=["moe_router"])
    with pytest.raises(InvalidConfigError, match="TorchTitan has no CUDA graph option"):
        run_of("llama3-8b", seq_len=4096, gbs=64, framework="torchtitan", cuda_graph_impl=TE)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mbs=st.sampled_from([1, 2, 4]), scope=st.sampled_from([["attn"], ["moe_router"], ["attn", "moe_router"], []]),
       padded=st.booleans(), hw=st.sampled_from(["b200", "h100-sxm", "gb200-nvl72"]))
def test_graphs_never_slow_a_run(mbs, scope, padded, hw):
    """Capturing only removes host work (each replay costs fewer host ops than any region it replaces):
    never slower, and the device time is the eager run's."""
    extra = DROP_AND_PAD if padded else {}
    if not scope and not padded:
        return  # the whole dropless layer cannot be captured (tested above)
    n = 16 if hw == "h100-sxm" else 8
    eager = project(run_of(hw=hw, n=n, mbs=mbs, **QWEN3, **extra))
    graphed = project(run_of(hw=hw, n=n, mbs=mbs, cuda_graph_impl=TE, cuda_graph_scope=scope, **QWEN3, **extra))
    assert graphed.iteration_time_s <= eager.iteration_time_s * (1 + 1e-12)
    assert graphed.breakdown.compute_s == pytest.approx(eager.breakdown.compute_s)
    assert graphed.memory.peak_bytes >= eager.memory.peak_bytes
