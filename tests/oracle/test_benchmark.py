"""Benchmark mode with real torch layers on the CPU: layer semantics, timing, cache, failure handling."""
from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from oracle.benchmark import torch_layers as tl  # noqa: E402
from oracle.benchmark.source import Bencher, BenchmarkSource  # noqa: E402
from oracle.benchmark.spec import LayerSpec, run_layer_specs  # noqa: E402
from oracle.benchmark.timing import TimingSettings, measure_spec  # noqa: E402
from oracle.config import RunConfig  # noqa: E402
from oracle.errors import BenchmarkError  # noqa: E402
from oracle.scaling import downscale  # noqa: E402

FAST = {"warmup": 0, "repeats": 1}


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """Behaviour, not this shared machine's load: the Bencher's load check sees nothing (the busy branch is
    tested with a scripted load)."""
    from oracle.benchmark.load import LoadMonitor
    monkeypatch.setattr(LoadMonitor, "since", lambda self, mark: None)


def _spec(**kw) -> LayerSpec:
    base = dict(kind="dense", hidden=64, mbs=1, seq_q=32, seq_k=32, dtype="fp32", heads=4, kv_heads=2, head_dim=16,
                ffn=96)
    base.update(kw)
    return LayerSpec(**base)


def _run(model: str, **training) -> RunConfig:
    t = {"seq_len": 64, "gbs": 8, "mbs": 1, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": "h100-sxm", "num_gpus": 8}, "training": t})


# ------------------------------------------------------------------------------------------ layers
def test_causal_attention_equals_an_explicit_mask_and_window_changes_it():
    torch.manual_seed(0)
    full = tl.build(_spec(), "cpu")
    x = torch.randn(1, 32, 64)
    y = full(x)
    masked = tl.build(_spec(window=32), "cpu")  # a window as long as the sequence is plain causal
    masked.load_state_dict(full.state_dict())
    assert torch.allclose(masked(x), y, atol=1e-5)
    narrow = tl.build(_spec(window=4), "cpu")
    narrow.load_state_dict(full.state_dict())
    assert not torch.allclose(narrow(x), y, atol=1e-4)
    # causality: the first token's output ignores later tokens
    x2 = x.clone()
    x2[:, 5:] += 1.0
    assert torch.allclose(full(x2)[:, :5], y[:, :5], atol=1e-5)


@pytest.mark.parametrize("window", [None, 4])
def test_unfused_attention_layer_computes_what_sdpa_does(window):
    """attention_backend=unfused times the materialised path (matmul, masked fp32 softmax, matmul), the same function:
    outputs and gradients equal SDPA's, GQA and a sliding window included; the spec says so in its cache key."""
    torch.manual_seed(0)
    fused = tl.build(_spec(window=window), "cpu")
    unfused = tl.build(_spec(window=window, unfused=True), "cpu")
    unfused.load_state_dict(fused.state_dict())
    x = torch.randn(1, 32, 64, requires_grad=True)
    y0, y1 = fused(x), unfused(x)
    assert torch.allclose(y0, y1, atol=1e-5)
    g0, = torch.autograd.grad(y0.square().sum(), x)
    g1, = torch.autograd.grad(y1.square().sum(), x)
    assert torch.allclose(g0, g1, atol=1e-4)
    assert '"unfused":true' in _spec(unfused=True).key() and "unfused" not in _spec().key()
    run = _run("tiny-dense", attention_backend="unfused")
    spec = run_layer_specs(run, downscale(run, 1), dtype="fp32")
    assert all(sp.unfused for (kind, _), sp in spec.items() if kind in ("dense", "moe"))


def test_balanced_dispatch_gives_every_expert_the_same_rows():
    p = tl.Permute(tokens=10, topk=3, experts=4)  # 30 pairs -> 8 rows per expert, 2 padding rows
    assert p.per == 8 and int(p.valid.sum()) == 30
    counts = torch.bincount(p.pair_index[p.valid.bool()] % 4, minlength=4)
    assert counts.max() - counts.min() <= 1
    assert sorted(p.pair_index[p.valid.bool()].tolist()) == list(range(30))


def test_unpermute_inverts_permute_weighted_by_scores():
    p = tl.Permute(tokens=10, topk=3, experts=4)
    u = tl.Unpermute(p, tokens=10)
    x = torch.randn(10, 8)
    scores = torch.rand(10, 3)
    assert torch.allclose(u(p(x), scores), x * scores.sum(dim=1, keepdim=True), atol=1e-5)


def test_ep_dispatch_orders_by_rank_then_sorts_received_chunks_by_local_expert():
    # 12 tokens x top-2 = 24 copies over 2 ranks x 3 local experts: 4 rows per (rank, expert) chunk
    p = tl.Permute(tokens=12, topk=2, experts=3, ranks=2)
    x = torch.arange(12.0).unsqueeze(1).repeat(1, 4)  # row t holds token id t
    seen = []
    p.exchange = lambda t: seen.append(t.shape) or t
    out = p(x)
    assert seen == [(24, 4)] and out.shape == (3, 8, 4)
    for e in range(3):  # local expert e holds, from each rank's chunk, the copies p with slot p % 6 = rank*3 + e
        tokens = out[e, :, 0].long().tolist()
        want = [q // 2 for r in range(2) for q in range(24) if q % 6 == r * 3 + e]
        assert tokens == want
    u = tl.Unpermute(p, tokens=12)
    scores = torch.rand(12, 2)
    assert torch.allclose(u(out, scores), x * scores.sum(dim=1, keepdim=True), atol=1e-5)


def test_ep_spec_times_the_local_expert_sort():
    run = _run("tiny-moe", ep=2)
    spec = run_layer_specs(run, downscale(run, 1), dtype="fp32")[("moe", None)]
    assert spec.ep_ranks == 2 and spec.experts == 4  # the EP=1 benchmark keeps the target's 4 experts per rank
    moe = tl.build(spec, "cpu").moe
    assert moe.permute.ranks == 2
    assert _run("tiny-moe").training.ep == 1
    assert run_layer_specs(_run("tiny-moe"), downscale(_run("tiny-moe"), 1))[("moe", None)].ep_ranks == 1


def test_moe_layer_routes_gradients_to_router_and_experts():
    spec = _spec(kind="moe", ffn=0, experts=4, router_experts=16, topk=2, expert_ffn=32, shared_ffn=32)
    layer = tl.build(spec, "cpu")
    layer(torch.randn(1, 32, 64, requires_grad=True)).sum().backward()
    assert layer.moe.router.gate.weight.grad is not None and layer.moe.router.gate.weight.shape[0] == 16
    assert layer.moe.experts_up.weight.grad.abs().sum() > 0
    assert set(tl.named_ops(layer)) >= {"router", "permute", "experts_up", "experts_down", "unpermute", "shared_mlp"}


def test_every_bundled_tiny_card_builds_and_runs():
    for model, tr in (("tiny-dense", {"tp": 2}), ("tiny-moe", {"ep": 2}), ("tiny-mla", {"ep": 2})):
        run = _run(model, **tr)
        for (kind, _), spec in run_layer_specs(run, downscale(run, 2), dtype="fp32").items():
            if kind == "optimizer":
                continue
            mod = tl.build(spec, "cpu")
            if kind == "embedding":
                out = mod(torch.randint(0, spec.vocab, (1, spec.seq_q)))
            elif kind == "output":
                out = mod(torch.randn(1, spec.seq_q, spec.hidden), torch.randint(0, spec.vocab, (1, spec.seq_q)))
            else:
                out = mod(torch.randn(1, spec.seq_q, spec.hidden))
            assert torch.isfinite(out).all(), (model, kind)


def test_tp_shard_has_the_rank_share_of_parameters():
    run1, run2 = _run("tiny-dense", tp=1), _run("tiny-dense", tp=2)
    s1 = run_layer_specs(run1, downscale(run1, 8))[("dense", None)]
    s2 = run_layer_specs(run2, downscale(run2, 8))[("dense", None)]
    assert (s2.heads, s2.kv_heads, s2.ffn) == (s1.heads // 2, s1.kv_heads // 2, s1.ffn // 2)
    n = lambda s: sum(p.numel() for n_, p in tl.build(s, "cpu").named_parameters() if "norm" not in n_)  # noqa: E731
    assert n(s2) == n(s1) // 2


# ------------------------------------------------------------------------------------------ timing
def test_measure_reports_positive_f_b_w_and_ops():
    m = measure_spec(_spec(), device=torch.device("cpu"), settings=TimingSettings(**FAST))
    assert m.f_s > 0 and m.b_s > 0 and m.w_s >= 0
    assert {"attn_norm", "qkv", "attn_core", "attn_out", "mlp_up", "mlp_down"} <= set(m.ops)
    assert m.params == sum(p.numel() for p in tl.build(_spec(), "cpu").parameters())


def test_optimizer_step_is_timed_on_a_rank_sized_shard():
    from oracle.benchmark.spec import optimizer_spec
    from oracle.memory import rank_param_counts
    run = _run("tiny-dense", pp=2, use_distributed_optimizer=False)
    spec = optimizer_spec(run)
    assert spec.kind == "optimizer"
    assert spec.params == int(float(f"{max(sum(rank_param_counts(run, r)) for r in range(2)):.2g}"))
    m = measure_spec(spec, device=torch.device("cpu"), settings=TimingSettings(**FAST))
    assert m.optimizer_s_per_param > 0 and m.params == spec.params and m.f_s == 0


def test_embedding_backward_is_b_and_output_has_w():
    emb = measure_spec(_spec(kind="embedding", vocab=256), device=torch.device("cpu"), settings=TimingSettings(**FAST))
    assert emb.b_s > 0 and emb.w_s == 0
    out = measure_spec(_spec(kind="output", vocab=256), device=torch.device("cpu"), settings=TimingSettings(**FAST))
    assert out.f_s > 0 and out.b_s > 0


def test_layer_that_cannot_be_built_names_layer_and_shape():
    bad = _spec(heads=3, kv_heads=2)  # 3 query heads cannot share 2 KV groups
    with pytest.raises(BenchmarkError, match=r"dense h=64 tokens=32.*shape"):
        measure_spec(bad, device=torch.device("cpu"), settings=TimingSettings(**FAST))


def test_out_of_memory_is_a_benchmark_error(monkeypatch):
    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    monkeypatch.setattr(tl, "build", boom)
    with pytest.raises(BenchmarkError, match="moe .*out of memory"):
        measure_spec(_spec(kind="moe", experts=2, router_experts=2, topk=1, expert_ffn=8),
                     device=torch.device("cpu"), settings=TimingSettings(**FAST))


# ------------------------------------------------------------------------------------------ cache
def test_cache_measures_each_shape_once_and_no_cache_always_measures(tmp_path):
    b = Bencher(cache_dir=str(tmp_path), **FAST)
    spec = _spec()
    first = b.measure(spec)
    assert b.measured == [spec.label()] and len(list(tmp_path.glob("*.json"))) == 1
    b2 = Bencher(cache_dir=str(tmp_path), **FAST)  # a new process: read from disk
    assert b2.measure(spec) == first and b2.measured == [] and b2.cache.hits == 1
    b2.measure(dataclasses.replace(spec, dtype="bf16"))  # another dtype is another entry
    assert len(b2.measured) == 1 and len(list(tmp_path.glob("*.json"))) == 2
    meta = json.loads(next(tmp_path.glob("*.json")).read_text())["meta"]
    assert {"device", "versions", "spec", "settings"} <= set(meta) and "torch" in meta["versions"]
    nc = Bencher(cache_dir=str(tmp_path), use_cache=False, **FAST)
    nc.measure(spec)
    nc.measure(spec)
    assert len(nc.measured) == 2


def test_a_layer_measured_under_other_load_is_flagged_and_not_cached(monkeypatch, tmp_path):
    from oracle.benchmark.compare import upscale_text
    from oracle.benchmark.load import LoadMonitor, LoadSeen
    monkeypatch.setattr(LoadMonitor, "since", lambda self, mark: LoadSeen(
        wall_s=1.0, other_cores=0.9, own_cores=1.0, steal_cores=0.0, cpus=2, need_cores=2))
    run = _run("tiny-dense")
    src = BenchmarkSource(bencher=Bencher(cache_dir=str(tmp_path), **FAST))
    rep = src.project(run).details["benchmark"]
    assert not list(tmp_path.glob("*.json")) and len(rep["busy_layers"]) == len(src.specs(run))
    assert "others used 0.90 of 2 core(s)" in rep["busy_layers"][0]
    assert "measured while other processes used the machine (not cached" in upscale_text(rep)


def test_search_records_a_failed_layer_as_a_failed_trial(monkeypatch):
    from searchers.evaluator import score_result

    def boom(*a, **k):
        raise torch.OutOfMemoryError("out of memory")
    monkeypatch.setattr(tl, "build", boom)
    run = _run("tiny-dense")
    src = BenchmarkSource(bencher=Bencher(use_cache=False, **FAST))
    res = score_result(src, run, run.key())
    assert res.status == "failed" and "out of memory" in res.reason and "dense" in res.reason


def test_end_to_end_benchmark_projection_on_cpu(tmp_path):
    run = _run("tiny-moe", pp=2, ep=2, gbs=8)
    src = BenchmarkSource(bencher=Bencher(cache_dir=str(tmp_path), **FAST))
    proj = src.project(run)
    assert proj.tokens_per_s_per_gpu > 0 and proj.mode == "benchmark"
    rep = proj.details["benchmark"]
    assert set(rep["layers"]) == {"dense", "moe", "embedding", "output"}
    assert rep["plan"]["bench"]["ep"] == 1 and rep["plan"]["bench"]["num_experts"] == 4
    assert rep["upscale"]["ep_a2a_delta_s"] > 0 and rep["upscale"]["pp_bubble_s"] > 0


def test_two_benchmark_devices_anchor_tp_by_ratio_and_ep_by_delta(tmp_path):
    """--benchmark-gpus 2: the TP all-gather and the MoE All-to-All of the benchmark layout are measured over
    two gloo processes and anchor the model's target comm (App. B.2)."""
    from oracle.compute import LayerModel
    from oracle.layout import Layout
    from oracle.projector import comm_model
    run = _run("tiny-moe", tp=2, ep=2, gbs=8)
    src = BenchmarkSource(benchmark_gpus=2, bencher=Bencher(cache_dir=str(tmp_path), **FAST))
    plan = src.plan(run)
    assert (plan.tp, plan.ep, plan.gpus) == (2, 2, 2)  # EP folds onto the TP ranks: 2 devices hold the layout
    for r, name, form in ((run, "tp", "ratio"), (run, "ep_a2a", "delta")):
        a = src.anchor_times(r)[name]
        assert a["form"] == form and a["measured_s"] > 0 and a["analytical_bench_s"] > 0
        L, cm = Layout(r), comm_model(r.cluster.hardware, r.cluster.num_gpus)
        target = LayerModel(L, cm).layer("moe").comm[name]
        got = src.layer_model(L, cm).layer("moe").comm[name]
        if form == "ratio":
            assert got.f_total_s == pytest.approx(target.f_total_s * a["measured_s"] / a["analytical_bench_s"])
        else:
            assert got.f_total_s == pytest.approx(max(0.0, target.f_total_s + 2 * (a["measured_s"] - a["analytical_bench_s"])))
    assert src.project(run).details["benchmark"]["collectives"]["tp"]["collective"].startswith("all_gather|g=2")



def test_gpu_check_script_runs_its_cpu_fallback_and_refuses_without_a_gpu(tmp_path):
    """experiments/gpu_check.sh: the path the GPU machine runs, on tiny cards (GPU_CHECK_ALLOW_CPU=1)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CPU fallback is not what would run")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_CHECK_REPEATS": "1",
           "OMP_NUM_THREADS": "1"}
    bad = subprocess.run(["bash", "experiments/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "GPU CHECK FAILED: no CUDA/ROCm device" in bad.stderr
    ok = subprocess.run(["bash", "experiments/gpu_check.sh"], cwd=ROOT, env={**env, "GPU_CHECK_ALLOW_CPU": "1"},
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "GPU CHECK OK" in ok.stdout and "simulate" in ok.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert len(report["runs"]) == 2 and all("error" not in r for r in report["runs"])
    assert all(r["benchmark_tokens_per_s_per_gpu"] > 0 for r in report["runs"])
