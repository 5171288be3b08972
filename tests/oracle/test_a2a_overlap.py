"""moe_a2a_overlap (Megatron --overlap-moe-expert-parallel-comm): legality, the merged forward/backward
exposure model and memory (the exports: tests/raytune_primus/test_export.py)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.compute import A2A_OVERLAP_SM_SHARE
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.projector import project

QWEN3 = dict(seq_len=4096, gbs=512, ep=8, precision="fp8")


def run_of(model="qwen3-30b-a3b", hw="gb200-nvl72", n=8, **t):
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": t})


def a2a(p):
    return next(c for c in p.breakdown.comm if c.kind == "ep_a2a")


def test_overlap_hides_the_all_to_all_behind_the_other_micro_batch_and_pays_for_the_sms():
    # on an HGX H100 node (NCCL's all-to-all over NVLink at the collectives' bus efficiency) a Qwen3 layer's
    # compute covers its all-to-all
    off = project(run_of(mbs=4, hw="h100-sxm", **QWEN3))
    on = project(run_of(mbs=4, hw="h100-sxm", moe_a2a_overlap=True, **QWEN3))
    c_off, c_on = a2a(off), a2a(on)
    assert c_on.total_s == pytest.approx(c_off.total_s)  # the same bytes move
    assert c_off.exposed_s == pytest.approx(c_off.total_s)  # NCCL all-to-all alone: all exposed
    # a Qwen3 layer's compute exceeds its all-to-all on NVLink: what stays exposed is the lone first
    # forward / last backward (1 of 16 micro-batches) plus the SM share of the hidden part
    u = 1 / 16
    assert c_on.exposed_s == pytest.approx(c_off.total_s * (u + (1 - u) * A2A_OVERLAP_SM_SHARE), rel=1e-6)
    assert on.iteration_time_s < off.iteration_time_s
    assert on.breakdown.compute_s == pytest.approx(off.breakdown.compute_s)
    # the activations in flight stay the schedule's (the paired forward saves what the backward frees)
    assert on.memory.peak_bytes == off.memory.peak_bytes


def test_more_micro_batches_leave_fewer_lone_passes():
    few = a2a(project(run_of(mbs=4, moe_a2a_overlap=True, **{**QWEN3, "gbs": 64})))  # 2 per rank
    many = a2a(project(run_of(mbs=4, moe_a2a_overlap=True, **QWEN3)))  # 16 per rank
    assert few.exposed_s / few.total_s > many.exposed_s / many.total_s


def test_an_all_to_all_longer_than_the_cover_stays_partly_exposed():
    """EP 32 over HGX nodes (400G NICs): the all-to-all outlasts the layer's compute; the overlap hides
    at most the other direction's compute."""
    kw = dict(seq_len=4096, gbs=1024, mbs=1, ep=32, precision="fp8")
    off = project(run_of(hw="b200", n=32, **kw))
    on = project(run_of(hw="b200", n=32, moe_a2a_overlap=True, **kw))
    assert a2a(on).exposed_s > 0.3 * a2a(off).exposed_s
    assert on.iteration_time_s < off.iteration_time_s


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mbs=st.sampled_from([1, 2, 4]), ep=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2]),
       backend=st.sampled_from(["alltoall", "deepep", "hybridep"]), recompute=st.sampled_from(["none", "selective"]),
       hw=st.sampled_from(["h100-sxm", "gb200-nvl72", "mi355x"]), delay=st.sampled_from([None, False]),
       sms=st.sampled_from([None, 8, 64]))
def test_overlap_never_makes_a_run_slower(mbs, ep, pp, backend, recompute, hw, delay, sms):
    t = dict(seq_len=1024, gbs=64, mbs=mbs, ep=ep, pp=pp, vpp=2 if pp > 1 else 1, recompute=recompute,
             moe_a2a_backend=backend, **({"moe_flex_dispatcher_num_sms": sms} if backend != "alltoall" and sms else {}))
    try:
        off = run_of("tiny-moe", hw, 16, **t)
    except InvalidConfigError:
        return
    on = run_of("tiny-moe", hw, 16, moe_a2a_overlap=True, delay_wgrad_compute=delay, **t)
    p_off, p_on = project(off), project(on)
    assert p_on.iteration_time_s <= p_off.iteration_time_s * (1 + 1e-12)
    assert 0 <= a2a(p_on).exposed_s <= a2a(p_on).total_s + 1e-12
    # per layer: the overlap hides no more of one direction's all-to-all than the other micro-batch's compute it
    # runs beside (its backward's dgrad, + wgrad when deferred; its forward), beyond what the run hid without it
    lm_on, lm_off = _layer_model(on), _layer_model(off)
    c_on, c_off = lm_on.layer("moe"), lm_off.layer("moe")
    part_on, part_off = c_on.comm["ep_a2a"], c_off.comm["ep_a2a"]
    cover_f = c_on.b_s + (c_on.w_s if on.training.delays_wgrad else 0.0)
    assert part_off.f_exposed_s - part_on.f_exposed_s <= cover_f * (1 + 1e-9)
    assert part_off.b_exposed_s - part_on.b_exposed_s <= c_on.f_s * (1 + 1e-9)
    assert part_on.f_exposed_s <= part_off.f_exposed_s * (1 + 1e-12)


def _layer_model(run):
    from oracle.layout import Layout
    from oracle.projector import LayerTimeSource, comm_model
    return LayerTimeSource().layer_model(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus))


@pytest.mark.parametrize("kw, match", [
    (dict(model="llama3-8b", ep=1), "needs a MoE model"),
    (dict(ep=1), "needs ep > 1"),
    (dict(ep=8, recompute="full"), "does not run with recompute=full"),
    (dict(ep=4, pp=2), "needs the interleaved schedule"),
    (dict(ep=4, pp=2, vpp=2, pp_schedule="zbv"), "needs the interleaved schedule"),
])
def test_megatron_refuses_what_it_refuses(kw, match):
    model = kw.pop("model", "qwen3-30b-a3b")
    with pytest.raises(InvalidConfigError, match=match):
        run_of(model, "gb200-nvl72", 8, seq_len=4096, gbs=64, moe_a2a_overlap=True, **kw)
    run_of("qwen3-30b-a3b", "gb200-nvl72", 8, seq_len=4096, gbs=64, ep=4, pp=2, vpp=2, moe_a2a_overlap=True)

