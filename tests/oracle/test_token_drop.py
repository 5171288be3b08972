"""Token-drop MoE (moe_expert_capacity_factor, moe_pad_expert_input_to_capacity): the busiest expert's
work is capped by the capacity (or padded to it), the router pays for the capacity top-k, drop-and-pad
removes the dispatcher's host sync, Megatron-Core's checks, the warnings, and how validate and export
read it."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import layer_activation_bytes
from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.layout import Layout
from oracle.legality import check
from oracle.opgraph import FP32, MASK, Shapes, layer_ops, moe_pairs
from oracle.projector import comm_model, project
from oracle.validate import TOKEN_DROP_ASSUMED, validate_rows
from raytune_primus.export import export_run


def _run(n: int = 8, hw: str = "b200", **training) -> RunConfig:
    tr = {"seq_len": 4096, "gbs": 64, "mbs": 1, "ep": 8, "precision": "fp8", **training}
    return RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": hw, "num_gpus": n},
                                "training": tr})


def _ops(run: RunConfig) -> dict:
    return {op.name: op for op in layer_ops(run.model, Shapes.of(run), "moe")}


def _layer(run: RunConfig):
    layout = Layout(run)
    return LayerModel(layout, comm_model(run.cluster.hardware, run.cluster.num_gpus)).layer("moe")


# ---------------------------------------------------------------- the work the experts see
@pytest.mark.parametrize("imbalance, cf, pad, load", [
    (1.0, None, False, 1.0),    # dropless, balanced
    (1.5, None, False, 1.5),    # dropless: the busiest expert takes all its tokens
    (1.5, 1.0, False, 1.0),     # token drop caps it at the capacity
    (1.5, 1.25, False, 1.25),
    (1.1, 1.25, False, 1.1),    # under the capacity nothing is dropped
    (1.0, 1.25, True, 1.25),    # padded: every expert computes its capacity
    (1.5, 1.25, True, 1.25),
])
def test_expert_gemms_take_the_capped_or_padded_load(imbalance, cf, pad, load):
    run = _run(moe_imbalance=imbalance, moe_expert_capacity_factor=cf, moe_pad_expert_input_to_capacity=pad)
    assert run.training.moe_load == load
    s = Shapes.of(run)
    card = run.model
    pairs = s.T_sp * card.moe_topk * load
    assert moe_pairs(card, s) == pytest.approx(pairs)
    ops = _ops(run)
    assert ops["experts_up"].m == math.ceil(pairs / (card.num_experts // 8))
    assert ("router_capacity" in ops) == (cf is not None)


def test_the_capacity_topk_is_the_hand_count():
    """Megatron-Core's topk_softmax_with_capacity reads the T x E fp32 probabilities twice and writes the
    capacity mask: 9 B per (token, expert) of the micro-batch's SP shard."""
    run = _run(moe_expert_capacity_factor=1.0)
    T, E = Shapes.of(run).T_sp, run.model.num_experts
    assert _ops(run)["router_capacity"].bytes_f == (2 * FP32 + MASK) * T * E == 9 * T * E


def test_padding_to_a_larger_capacity_costs_device_time_and_memory():
    """cf 1.25 padded computes a quarter more expert rows than cf 1.0 padded (and the all-to-all sends them)."""
    one, more = _run(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True), \
        _run(moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True)
    a, b = _layer(one), _layer(more)
    assert b.f_s > a.f_s and b.b_s > a.b_s
    assert b.comm["ep_a2a"].f_total_s > a.comm["ep_a2a"].f_total_s
    assert layer_activation_bytes(more, "moe") > layer_activation_bytes(one, "moe")


def test_a_capacity_makes_an_imbalanced_layer_no_slower_than_the_capacity_allows():
    """moe_imbalance 2 dropless vs capped at 1.0: the capped busiest expert does half the expert work."""
    free, capped = _layer(_run(moe_imbalance=2.0)), _layer(_run(moe_imbalance=2.0, moe_expert_capacity_factor=1.0))
    up = {c: next(p for p in lc.ops if p[0].name == "experts_up") for c, lc in (("free", free), ("capped", capped))}
    assert up["capped"][1] < up["free"][1]
    assert capped.comm["ep_a2a"].f_total_s < free.comm["ep_a2a"].f_total_s


def test_drop_and_pad_has_no_dispatcher_sync_and_plain_capacity_keeps_it():
    """Static splits (padded) need no device-to-host sync; capacity without padding still reads the counts."""
    dropless = _layer(_run(mbs=4))
    capped = _layer(_run(mbs=4, moe_expert_capacity_factor=1.0))
    padded = _layer(_run(mbs=4, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True))
    stall = _run().cluster.hardware.efficiency.moe_sync_stall_s
    assert stall > 0
    assert dropless.host_f_s >= stall and capped.host_f_s >= stall
    assert padded.host_f_s < capped.host_f_s
    assert not _run(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True).training.moe_host_sync


@settings(max_examples=25, deadline=None)
@given(lo=st.floats(0.5, 2.0), hi=st.floats(0.5, 2.0), imbalance=st.floats(1.0, 3.0), pad=st.booleans())
def test_memory_and_expert_work_never_shrink_with_the_capacity(lo, hi, imbalance, pad):
    lo, hi = sorted((lo, hi))
    a = _run(moe_imbalance=imbalance, moe_expert_capacity_factor=lo, moe_pad_expert_input_to_capacity=pad)
    b = _run(moe_imbalance=imbalance, moe_expert_capacity_factor=hi, moe_pad_expert_input_to_capacity=pad)
    assert a.training.moe_load <= b.training.moe_load
    assert layer_activation_bytes(a, "moe") <= layer_activation_bytes(b, "moe")
    # a capacity never makes the busiest expert's work exceed the dropless one's unless it pads
    free = _run(moe_imbalance=imbalance)
    if not pad:
        assert a.training.moe_load <= free.training.moe_load


# ---------------------------------------------------------------- Megatron-Core's checks, the warnings
@pytest.mark.parametrize("training, needle", [
    ({"moe_pad_expert_input_to_capacity": True}, "needs moe_expert_capacity_factor"),
    ({"moe_expert_capacity_factor": 0.0}, "must be > 0"),
    ({"moe_expert_capacity_factor": 1.0, "moe_a2a_backend": "deepep"}, "alltoall dispatcher only"),
    ({"moe_expert_capacity_factor": 100.0}, "exceeds experts/top-k"),
    ({"moe_expert_capacity_factor": 1.0, "framework": "torchtitan", "fsdp": True}, "its MoE is dropless"),
])
def test_illegal_token_drop_settings_are_named(training, needle):
    with pytest.raises(InvalidConfigError, match=re.escape(needle)):
        _run(**training)


def test_a_capacity_factor_on_a_dense_model_is_refused():
    with pytest.raises(InvalidConfigError, match="moe_expert_capacity_factor=1.0 needs a MoE model; llama3-8b is dense"):
        RunConfig.from_dict({"model": "llama3-8b", "cluster": {"hardware": "b200", "num_gpus": 8},
                             "training": {"seq_len": 4096, "gbs": 16, "moe_expert_capacity_factor": 1.0}})
    legal = _run(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    assert check(legal) == []


def test_projection_warns_what_is_dropped_and_padded():
    drops = project(_run(moe_imbalance=1.5, moe_expert_capacity_factor=1.0))
    assert any("drops 33% of its tokens" in w for w in drops.warnings)
    pads = project(_run(moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True))
    assert any("20% of the expert GEMM rows are padding" in w for w in pads.warnings)
    assert not [w for w in project(_run()).warnings if "token" in w or "pad" in w]


# ---------------------------------------------------------------- validate and export
def _row(notes: str) -> dict[str, str]:
    return {"id": "r1", "group": "g", "model": "qwen3-30b-a3b", "hardware": "b200", "num_gpus": "8",
            "seq_len": "4096", "gbs": "512", "mbs": "1", "tp": "1", "pp": "1", "ep": "8", "precision": "fp8",
            "measured_tokens_per_s_per_gpu": "10000", "quality": "A", "notes": notes}


def test_validate_prices_a_tokendrop_row_as_drop_and_pad_and_says_so():
    (td,), (dl,) = validate_rows([_row("ga=64;variant=tokendrop")]), validate_rows([_row("token_dropless=true")])
    cfg = td.projection.config["training"]
    assert {k: cfg[k] for k in TOKEN_DROP_ASSUMED} == TOKEN_DROP_ASSUMED
    assert any("variant=tokendrop" in a for a in td.assumed)
    assert dl.projection.config["training"]["moe_expert_capacity_factor"] is None
    assert not any("tokendrop" in a for a in dl.assumed)


def test_export_writes_megatrons_token_drop_flags():
    run = _run(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    text = export_run(run, "megatron")
    assert "--moe-expert-capacity-factor 1.0" in text and "--moe-pad-expert-input-to-capacity" in text
    assert "moe_expert_capacity_factor: 1.0" in export_run(run, "primus")
    assert "--moe-expert-capacity-factor" not in export_run(_run(), "megatron")
