"""Fewer KV heads than tensor-parallel ranks (num_query_groups < tp): Megatron-Core 0.19 splits the fused QKV
weight evenly over TP and all-gathers its output in every layer (``SelfAttention.get_query_key_value_tensors``);
TorchTitan refuses the layout (its decoder checks tp | n_kv_heads)."""
from __future__ import annotations

import pytest

from oracle.activations import attention_params_per_gpu
from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.layout import Layout
from oracle.legality import check as problems
from oracle.model_card import load_model
from oracle.opgraph import BF16, Shapes, layer_ops, qkv_gather_bytes
from oracle.projector import comm_model, project


def _run(tp: int, model: str = "qwen3-30b-a3b", **training) -> RunConfig:
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
                                "training": {"tp": tp, "ep": 2, "seq_len": 4096, "gbs": 64, **training}})


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_the_qkv_weight_is_split_over_tp_without_replicating_a_head(tp):
    card = load_model("qwen3-30b-a3b")  # 4 KV heads: tp 8 and 16 have fewer heads than ranks
    norms = 2 * card.norm_params(card.head_size)  # q/k norms replicated on every rank
    whole = attention_params_per_gpu(card, 1) - norms
    assert tp * (attention_params_per_gpu(card, tp) - norms) == pytest.approx(whole, rel=1e-12)


def test_the_qkv_op_holds_the_rank_share_of_the_fused_output():
    run = _run(8)
    card = run.model
    qkv = next(op for op in layer_ops(card, Shapes.of(run), "moe") if op.name == "qkv")
    assert qkv.n == (card.q_width + 2 * card.kv_heads * card.head_size) // 8


def test_gathered_qkv_bytes_only_when_kv_heads_are_fewer_than_ranks():
    for tp in (1, 2, 4):
        assert qkv_gather_bytes(_run(tp).model, Shapes.of(_run(tp))) == 0.0
    run = _run(8)
    card, s = run.model, Shapes.of(run)
    assert qkv_gather_bytes(card, s) == BF16 * s.T * (card.q_width + 2 * card.kv_heads * card.head_size)
    mla = _run(8, model="deepseek-v2-lite")
    assert qkv_gather_bytes(mla.model, Shapes.of(mla)) == 0.0


def test_the_layer_pays_the_gather_forward_and_its_reduce_scatter_backward_exposed():
    run = _run(8)
    lm = LayerModel(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus))
    cost = lm.layer("moe")
    gathered = qkv_gather_bytes(run.model, lm.shapes)
    ag = lm._coll("all_gather", "tp", gathered).time_s
    rs = lm._coll("reduce_scatter", "tp", gathered).time_s
    pairs = lm._tp_comm(BF16 * lm.T * run.model.hidden_size, 1, 0.0, 0.0)  # no GEMM to hide behind: all exposed
    tp = cost.comm["tp"]
    assert ag > 0 and rs > 0
    assert tp.f_total_s == pytest.approx(pairs.f_total_s + ag)
    assert tp.b_total_s == pytest.approx(pairs.b_total_s + rs)
    assert tp.f_exposed_s - ag <= pairs.f_exposed_s + 1e-15  # the gather itself hides behind nothing
    assert tp.f_exposed_s >= ag and tp.b_exposed_s >= rs


def test_torchtitan_refuses_fewer_kv_heads_than_ranks_and_megatron_projects_it():
    with pytest.raises(InvalidConfigError, match="tp=8 with framework=torchtitan must divide the 4 KV heads"):
        _run(8, framework="torchtitan", fsdp=True)
    assert not any("KV heads" in m for m in problems(_run(4, framework="torchtitan", fsdp=True)))
    assert project(_run(8)).tokens_per_s_per_gpu > 0
