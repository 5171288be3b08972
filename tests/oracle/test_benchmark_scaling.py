"""Downscale (paper Algorithm 1) and upscale of benchmark mode, with synthetic measurements (no torch)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.benchmark.measurement import Measurement, OpTime
from oracle.benchmark.source import GEMM_OPS, MATMUL_OPS, BenchmarkSource, dtype_speedup, fp8_speedup
from oracle.benchmark.spec import LayerSpec, run_layer_specs
from oracle.config import RunConfig
from oracle.errors import BenchmarkError
from oracle.layout import Layout
from oracle.memory import rank_param_counts
from oracle.projector import comm_model, project
from oracle.compute import LayerModel
from oracle.scaling import downscale, layout_gpus


def _run(model: str = "tiny-moe", gpus: int = 32, hw: str = "h100-sxm", **training) -> RunConfig:
    t = {"seq_len": 256, "gbs": 64, "mbs": 1, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": gpus}, "training": t})


# ------------------------------------------------------------------------------------------ downscale
def test_paper_example_pp4_ep8_to_one_gpu_in_two_steps():
    run = _run(gpus=32, pp=4, ep=8, tp=1)
    assert layout_gpus(tp=1, pp=4, cp=1, ep=8, etp=1) == 32
    plan = downscale(run, 1)
    assert len(plan.steps) == 2
    assert plan.steps[0].startswith("PP 4 -> 1") and "(8 GPUs)" in plan.steps[0]
    assert plan.steps[1].startswith("EP 8 -> 1") and "(1 GPUs)" in plan.steps[1]
    assert (plan.pp, plan.ep, plan.tp) == (1, 1, 1)
    assert plan.num_experts == 1 and plan.experts_per_rank == run.model.num_experts // 8  # experts/rank kept


def test_pp_only_when_it_suffices():
    plan = downscale(_run(gpus=32, pp=4, ep=8), 8)
    assert plan.steps == ("PP 4 -> 1 (8 GPUs)",)
    assert (plan.pp, plan.ep, plan.num_experts) == (1, 8, 8)


def test_ep_partially_reduced_keeps_experts_per_rank():
    plan = downscale(_run(gpus=32, pp=4, ep=8), 2)
    assert (plan.pp, plan.ep) == (1, 2)
    assert plan.experts_per_rank == 1 and plan.num_experts == 2


def test_tp_reduced_last_and_rescales_compute():
    run = _run("tiny-dense", gpus=16, tp=4, pp=2)
    plan = downscale(run, 1)
    assert [s.split()[0] for s in plan.steps] == ["PP", "TP"]
    assert plan.tp == 1 and plan.tp_compute_scale == pytest.approx(0.25)


def test_target_that_fits_is_not_reduced():
    plan = downscale(_run("tiny-dense", gpus=8, tp=2, pp=2), 4)
    assert plan.steps == () and (plan.tp, plan.pp) == (2, 2) and plan.tp_compute_scale == 1.0


def test_cp_is_never_reduced():
    run = _run("tiny-dense", gpus=8, cp=2, seq_len=512)
    with pytest.raises(BenchmarkError, match="CP=2 is never reduced"):
        downscale(run, 1)
    assert downscale(run, 2).cp == 2


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2, 4, 8]),
       n=st.sampled_from([1, 2, 4, 8, 16]))
def test_downscale_invariants(tp, pp, ep, n):
    """The plan fits, keeps CP and experts/rank, and only shrinks TP once PP and EP are down to 1."""
    run = _run(gpus=64, tp=tp, pp=pp, ep=ep)
    plan = downscale(run, n)
    assert plan.gpus <= n
    assert plan.cp == run.training.cp
    assert plan.experts_per_rank == run.model.num_experts // ep
    assert plan.tp <= tp and plan.pp <= pp and plan.ep <= ep
    if plan.tp < tp:
        assert plan.pp == 1 and plan.ep == 1
    if plan.ep < ep:
        assert plan.pp == 1
    if layout_gpus(tp=tp, pp=pp, cp=1, ep=ep, etp=1) <= n:
        assert plan.steps == ()


# ------------------------------------------------------------------------------------------ upscale
def _synthetic(run: RunConfig, plan_gpus: int = 1, scale: float = 1.0, dtype: str = "") -> dict[str, Measurement]:
    """Made-up measurements: every op 1 ms x scale forward, 2 ms B, 1 ms W; layers their sums; timed in
    ``dtype`` ('' = the spec's)."""
    src = BenchmarkSource(benchmark_gpus=plan_gpus, measure=False)
    out = {}
    for (kind, _), spec in src.specs(run).items():
        ops = {}
        if kind == "dense":
            names = ["attn_norm", "qkv", "attn_core", "attn_out", "mlp_norm", "mlp_up", "mlp_act", "mlp_down"]
        elif kind == "moe":
            names = ["attn_norm", "qkv", "attn_core", "attn_out", "mlp_norm", "router", "permute", "experts_up",
                     "experts_act", "experts_down", "unpermute"]
        else:
            names = []
        for n in names:
            ops[n] = OpTime(f_s=1e-3 * scale, b_s=2e-3 * scale, w_s=1e-3 * scale)
        k = max(1, len(names))
        out[spec.key()] = Measurement(spec_key=spec.key(), f_s=k * 1e-3 * scale, b_s=k * 2e-3 * scale,
                                      w_s=k * 1e-3 * scale, ops=ops, params=1000, optimizer_s_per_param=1e-9,
                                      dtype=dtype)
    return out


def _source(run: RunConfig, **kw) -> BenchmarkSource:
    return BenchmarkSource(timings=_synthetic(run, **kw), measure=False)


def test_missing_measurement_is_a_clear_error():
    run = _run("tiny-dense", gpus=8)
    with pytest.raises(BenchmarkError, match="no measurement of dense"):
        BenchmarkSource(measure=False).project(run)


def test_pp1_iteration_is_microbatches_times_measured_layers_plus_analytical_extras():
    run = _run("tiny-dense", gpus=1, gbs=4)
    src = _source(run)
    proj = src.project(run)
    specs = src.specs(run)
    per_mb = sum(m.f_s + m.b_s + m.w_s for m in (src.get(specs[("dense", None)]),)) * run.model.num_layers
    emb, out = src.get(specs[("embedding", None)]), src.get(specs[("output", None)])
    per_mb += emb.f_s + emb.b_s + out.f_s + out.b_s + out.w_s  # the embedding has no W (its grad is B)
    mb = Layout(run).num_microbatches
    assert proj.breakdown.compute_s == pytest.approx(mb * per_mb)
    assert proj.breakdown.optimizer_s == pytest.approx(1e-9 * sum(rank_param_counts(run, 0)))  # rate x shard (dp=1)
    assert proj.breakdown.sources["compute"] == "measured" and proj.breakdown.sources["optimizer"] == "measured"
    assert proj.details["benchmark"]["plan"]["steps"] == []


def test_tp_upscale_rescales_measured_compute_and_adds_analytical_tp_comm():
    run1 = _run("tiny-dense", gpus=8, tp=1)
    run4 = _run("tiny-dense", gpus=8, tp=4)
    src = _source(run4)  # measured at TP=1 (1 device), target TP=4
    assert src.plan(run4).tp == 1
    L, comm = Layout(run4), comm_model(run4.cluster.hardware, 8)
    lm = src.layer_model(L, comm)
    measured = src.get(src.specs(run4)[("dense", None)])
    assert lm.layer("dense").f_s == pytest.approx(measured.f_s / 4)  # every op TP-split here
    sim_comm = LayerModel(L, comm).layer("dense").comm
    assert lm.layer("dense").comm == sim_comm and "tp" in sim_comm  # AR/AG/RS priced at the target
    report = src.project(run4).details["benchmark"]["upscale"]
    assert report["tp_compute_scale"] == pytest.approx(0.25) and report["tp_comm_s"] > 0
    assert _source(run1).project(run1).details["benchmark"]["upscale"]["tp_comm_s"] == 0


def test_ep_upscale_adds_target_a2a_and_keeps_expert_compute():
    run = _run(gpus=32, pp=4, ep=8)
    src = _source(run)
    proj = src.project(run)
    up = proj.details["benchmark"]["upscale"]
    sim = project(run)
    a2a_sim = {c.kind: c for c in sim.breakdown.comm}["ep_a2a"]
    assert up["ep_a2a_delta_s"] == pytest.approx(a2a_sim.exposed_s) and up["ep_a2a_delta_s"] > 0
    L, comm = Layout(run), comm_model(run.cluster.hardware, 32)
    m = src.get(src.specs(run)[("moe", None)])
    assert src.layer_model(L, comm).layer("moe").f_s == pytest.approx(m.f_s)  # tp=etp=1: compute kept verbatim


def test_a2a_overlap_hides_the_target_a2a_behind_the_measured_compute():
    """moe_a2a_overlap in benchmark mode: the cover is the measured layer compute, not the analytical."""
    off_run = _run(gpus=32, pp=2, vpp=2, ep=8)
    on_run = dataclasses.replace(off_run, training=off_run.training.replace(moe_a2a_overlap=True))
    L, comm = Layout(on_run), comm_model(on_run.cluster.hardware, 32)
    for scale in (1.0, 1e-3):  # measured compute far above / far below the all-to-all
        lm = _source(on_run, scale=scale).layer_model(L, comm)
        c = lm.layer("moe")
        part = c.comm["ep_a2a"]
        assert part.f_exposed_s == pytest.approx(lm.sim.overlapped_a2a_s(part.f_total_s, c.b_s + c.w_s))
        assert part.b_exposed_s == pytest.approx(lm.sim.overlapped_a2a_s(part.b_total_s, c.f_s))
        off = _source(off_run, scale=scale).layer_model(Layout(off_run), comm).layer("moe").comm["ep_a2a"]
        assert part.f_exposed_s <= off.f_exposed_s and part.b_exposed_s <= off.b_exposed_s
    assert _source(on_run).project(on_run).iteration_time_s < _source(off_run).project(off_run).iteration_time_s


def test_pp_upscale_resimulates_the_target_schedule():
    run = _run("tiny-dense", gpus=4, pp=4, gbs=16)
    flat = _run("tiny-dense", gpus=1, pp=1, gbs=16)
    proj = _source(run).project(run)
    assert proj.details["benchmark"]["plan"]["steps"][0].startswith("PP 4 -> 1")
    assert proj.breakdown.bubble_s > 0
    assert proj.details["benchmark"]["upscale"]["pp_bubble_s"] == pytest.approx(proj.breakdown.bubble_s)
    # more stages, same per-layer times: each rank computes a quarter of the layers
    assert proj.breakdown.compute_s < _source(flat).project(flat).breakdown.compute_s


def test_fp8_rescales_only_gemm_ops():
    bf = _run("tiny-dense", gpus=8, precision="bf16")
    f8 = _run("tiny-dense", gpus=8, precision="fp8")
    ratio = fp8_speedup(f8)
    assert ratio > 1 and fp8_speedup(bf) == 1.0
    L, comm = Layout(f8), comm_model(f8.cluster.hardware, 8)
    src = BenchmarkSource(timings=_synthetic(bf), measure=False)
    assert src.specs(bf) == src.specs(f8)  # fp8 configs time bf16 layers
    m = src.get(src.specs(f8)[("dense", None)])
    n_gemm = sum(1 for k in m.ops if k in GEMM_OPS)
    expect = (len(m.ops) - n_gemm + n_gemm / ratio) / len(m.ops)
    assert src.layer_model(L, comm).layer("dense").f_s == pytest.approx(m.f_s * expect)


def test_benchmark_source_is_a_layer_timer_shapes_measure_project():
    run = _run(gpus=32, pp=4, ep=8)
    src = _source(run)
    shapes = src.shapes(run)
    assert len(shapes) == len(set(shapes)) == 5  # dense, moe, embedding, output, optimizer
    kinds = {LayerSpec.from_key(s).kind for s in shapes}
    assert kinds == {"dense", "moe", "embedding", "output", "optimizer"}
    timings = {s: src.measure(s) for s in shapes}  # dicts, as the device actors pass them around
    fresh = BenchmarkSource(measure=False)
    p = fresh.project(run, timings)
    assert p.tokens_per_s_per_gpu == pytest.approx(src.project(run).tokens_per_s_per_gpu)


def test_moe_spec_keeps_experts_per_rank_and_full_router():
    run = _run(gpus=32, ep=8)
    spec = run_layer_specs(run, downscale(run, 1))[("moe", None)]
    assert spec.experts == run.model.num_experts // 8 and spec.router_experts == run.model.num_experts
    assert dataclasses.replace(spec).key() == spec.key() and LayerSpec.from_key(spec.key()) == spec


def test_benchmark_mode_says_its_layers_ran_eager_when_graphs_are_asked_for():
    """CUDA graphs save host time that the eager torch layers' measurement contains: the projection says so."""
    run = _run("tiny-dense", gpus=1, gbs=4)
    graphed = dataclasses.replace(run, training=run.training.replace(cuda_graph_impl="transformer_engine"))
    assert not any("eager layers" in w for w in _source(run).project(run).warnings)
    assert any("eager layers" in w for w in _source(graphed).project(graphed).warnings)
    assert not any("eager layers" in w for w in project(graphed).warnings)  # simulate prices the graphs


def test_the_fp8_speedup_of_measured_bf16_gemms_follows_the_recipe():
    """Benchmark mode scales measured bf16 GEMMs to the target's FP8 rate: MXFP8 at its own efficiency."""
    base = _run("tiny-dense", gpus=1, gbs=4, hw="b200", precision="fp8")
    mx = dataclasses.replace(base, training=base.training.replace(fp8_recipe="mxfp8"))
    e = base.cluster.hardware.efficiency
    assert fp8_speedup(mx) / fp8_speedup(base) == pytest.approx(e.gemm_mxfp8 / e.gemm_fp8)


# ------------------------------------------------------------------------------------------ measured dtype
def _profile_dict(name: str) -> dict:
    from pathlib import Path

    import yaml

    from oracle.hardware import PROFILE_DIR
    return yaml.safe_load((Path(PROFILE_DIR) / f"{name}.yaml").read_text())


def _on(run: RunConfig, data: dict, name: str) -> RunConfig:
    from oracle.hardware import profile_from_dict
    return dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, hardware=profile_from_dict(data, name)))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_layers_timed_in_fp32_are_priced_as_the_targets_bf16_by_the_profile_ratio(precision):
    """A device without native bf16 times fp32 layers: the matmul ops (GEMMs, attention core) and the output
    layer are divided by the target's achievable bf16/fp32 GEMM ratio (peaks from the profile, equal efficiency),
    the fp8 speed-up on top for fp8 GEMMs; element-wise ops and the embedding stay as measured."""
    run = _run("tiny-dense", gpus=1, gbs=4, hw="h100-sxm", precision=precision)
    hw = run.cluster.hardware
    ratio = dtype_speedup(run, "fp32")
    assert ratio == pytest.approx(hw.peak_flops_per_s["bf16"] / hw.peak_flops_per_s["fp32"])
    assert dtype_speedup(run, "bf16") == 1.0
    bf, f32 = _source(run), _source(run, dtype="fp32")
    L, comm = Layout(run), comm_model(hw, 1)
    m = f32.get(f32.specs(run)[("dense", None)])
    fp8 = fp8_speedup(run)
    expect = sum(o.total_s / (ratio * (fp8 if k in GEMM_OPS else 1.0) if k in MATMUL_OPS else 1.0)
                 for k, o in m.ops.items()) / sum(o.total_s for o in m.ops.values())
    assert f32.layer_model(L, comm).layer("dense").f_s == pytest.approx(m.f_s * expect)
    assert bf.layer_model(L, comm).layer("dense").f_s == pytest.approx(m.f_s * (
        sum(o.total_s / (fp8 if k in GEMM_OPS else 1.0) for k, o in m.ops.items()) / sum(o.total_s for o in m.ops.values())))
    assert f32.layer_model(L, comm).output()[0] == pytest.approx(bf.layer_model(L, comm).output()[0] / ratio)
    assert f32.layer_model(L, comm).embedding() == bf.layer_model(L, comm).embedding()
    rep = f32.project(run).details["benchmark"]
    assert rep["measured_dtypes"] == ["fp32"] and rep["dtype_speedup"]["fp32"] == pytest.approx(ratio)
    assert "h100-sxm" in rep["dtype_note"] and "compute.peak_tflops" in rep["dtype_note"]
    assert bf.project(run).details["benchmark"]["dtype_note"] == ""


def test_a_device_whose_bf16_is_its_fp32_prices_fp32_layers_as_they_ran():
    """A profile calibrated on a CPU without bf16 carries bf16 = fp32 peaks: fp32 timings are its bf16 times."""
    d = _profile_dict("cpu-host")
    d["compute"]["peak_tflops"]["bf16"] = d["compute"]["peak_tflops"]["fp32"]
    run = _on(_run("tiny-dense", gpus=1, gbs=4), d, "no-bf16")
    assert dtype_speedup(run, "fp32") == 1.0
    f32, bf = _source(run, dtype="fp32"), _source(run)
    assert f32.project(run).iteration_time_s == pytest.approx(bf.project(run).iteration_time_s)


def test_a_profile_without_the_measured_dtype_is_a_clear_error():
    d = _profile_dict("cpu-host")
    del d["compute"]["peak_tflops"]["fp32"]
    run = _on(_run("tiny-dense", gpus=1, gbs=4), d, "bf16-only")
    with pytest.raises(BenchmarkError, match="has no fp32 peak .*--dtype"):
        _source(run, dtype="fp32").project(run)
