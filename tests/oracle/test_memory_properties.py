"""Physics of the memory projection as Hypothesis properties over small legal configs of the test cards."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import project_memory

CARDS = ("tiny-dense", "tiny-moe", "tiny-mla")
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


@st.composite
def configs(draw) -> dict:
    """Training sections (plus model and GPU count) that are mostly legal by construction."""
    model = draw(st.sampled_from(CARDS))
    tp, pp, cp, dp = (draw(st.sampled_from(v)) for v in ([1, 2, 4], [1, 2, 4], [1, 2], [1, 2]))
    sched, vpp = "1f1b", 1
    if pp > 1:
        sched = draw(st.sampled_from(["1f1b", "zero_bubble", "ilp"]
                                     + (["interleaved", "zbv", "zbv_greedy", "v_half", "v_min"] if pp == 2 else [])))
        vpp = 1 if sched in ("1f1b", "zero_bubble", "ilp") else 2
    ep = etp = 1
    if model != "tiny-dense":
        fold = tp * cp * dp  # ep x etp fold into the tp x cp x dp ranks of a stage
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if fold % e == 0]))
        etp = draw(st.sampled_from([e for e in (1, 2) if fold % (ep * e) == 0]))
    mbs = draw(st.sampled_from([1, 2]))
    fp8 = draw(st.booleans())
    t = dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, pp_schedule=sched, mbs=mbs,
             seq_len=draw(st.sampled_from([128, 256, 512])), gbs=2 * mbs * dp * draw(st.sampled_from([1, 2, 4])),
             recompute=draw(st.sampled_from(["none", "selective", "full"])),
             use_distributed_optimizer=draw(st.booleans()), fsdp=draw(st.booleans()),
             precision="fp8" if fp8 else "bf16", fp8_activations=fp8 and draw(st.booleans()),
             loss_fusion=draw(st.booleans()), moe_imbalance=draw(st.sampled_from([1.0, 1.5])),
             moe_a2a_backend="deepep" if model != "tiny-dense" and draw(st.booleans()) else "alltoall")
    return {"model": model, "num_gpus": tp * pp * cp * dp, "training": t}


def build(cfg: dict, **changes) -> RunConfig:
    t = {**cfg["training"], **changes}
    n = cfg["num_gpus"] * (t["tp"] * t["pp"]) // (cfg["training"]["tp"] * cfg["training"]["pp"])
    try:
        return RunConfig.from_dict({"model": cfg["model"], "cluster": {"hardware": "h100-sxm", "num_gpus": n},
                                    "training": t})
    except InvalidConfigError:
        assume(False)
        raise


@SETTINGS
@given(configs())
def test_all_terms_non_negative_and_finite(cfg):
    mem = project_memory(build(cfg), trees="all")
    for s in mem.stages:
        terms = (s.params_bytes, s.grads_bytes, s.optimizer_bytes, s.activations_bytes, s.other_bytes,
                 s.in_flight_microbatches) + tuple(v for _, v in s.other_breakdown)
        assert all(x >= 0 and math.isfinite(x) for x in terms)
        assert s.tree is not None and s.tree.activation_bytes >= 0 and s.tree.params > 0
    assert mem.peak_bytes == max(s.total_bytes for s in mem.stages)


@pytest.mark.parametrize("key", ["mbs", "seq_len"])
@SETTINGS
@given(cfg=configs())
def test_total_non_decreasing_when_micro_batch_or_sequence_doubles(key, cfg):
    x = cfg["training"][key]
    small, big = project_memory(build(cfg, **{key: x})), project_memory(build(cfg, **{key: 2 * x}))
    for a, b in zip(small.stages, big.stages):
        assert b.total_bytes >= a.total_bytes * (1 - 1e-12)


@SETTINGS
@given(configs())
def test_recompute_never_adds_activation_memory(cfg):
    acts = {rc: [s.activations_bytes for s in project_memory(build(cfg, recompute=rc), trees="none").stages]
            for rc in ("none", "selective", "full")}
    for none, sel, full in zip(acts["none"], acts["selective"], acts["full"]):
        assert full <= sel <= none


@SETTINGS
@given(configs())
def test_weights_per_gpu_non_increasing_in_tp(cfg):
    tp = cfg["training"]["tp"]
    assume(tp <= 2)
    lo = max(s.params_bytes for s in project_memory(build(cfg, tp=tp), trees="none").stages)
    hi = max(s.params_bytes for s in project_memory(build(cfg, tp=2 * tp), trees="none").stages)
    assert hi <= lo


@SETTINGS
@given(configs())
def test_weights_per_gpu_non_increasing_in_pp(cfg):
    t = cfg["training"]
    assume(t["pp"] <= 2 and t["vpp"] == 1)
    lo = max(s.params_bytes for s in project_memory(build(cfg, pp=t["pp"]), trees="none").stages)
    hi = max(s.params_bytes for s in project_memory(build(cfg, pp=2 * t["pp"], pp_schedule="1f1b"), trees="none").stages)
    assert hi <= lo
