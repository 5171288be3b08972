"""The CPU end-to-end trainer really trains in several gloo processes (DDP, pipelining 1F1B, EP all-to-all), and
the e2e runner projects each run from a single-process benchmark. Accuracy is not asserted here: it needs a
quiet machine (docs/benchmark.md); this checks that every path runs and reports what it should."""
import math

import pytest

torch = pytest.importorskip("torch")

from raytune_primus.e2e import runner  # noqa: E402
from raytune_primus.e2e.trainer import TrainJob, ep_moe, run_job  # noqa: E402

pytestmark = pytest.mark.slow

BASE = {"seq_len": 64, "mbs": 1, "use_distributed_optimizer": False, "pp_schedule": "1f1b"}


def _job(name, model, gpus, **tr):
    return TrainJob(name=name, config={"model": model, "cluster": {"hardware": "cpu-host", "num_gpus": gpus},
                                       "training": {**BASE, **tr}}, warmup=1, iterations=2)


@pytest.mark.parametrize("job", [
    _job("dp2", "tiny-dense", 2, gbs=4),
    _job("pp2", "tiny-dense", 2, gbs=4, pp=2),
    _job("ep2", "tiny-moe", 2, gbs=4, ep=2, overlap_grad_reduce=False),
], ids=lambda j: j.name)
def test_trainer_runs_every_parallelism(job):
    res = run_job(job)
    assert res["world"] == 2 and len(res["iteration_times_s"]) == 2
    assert res["tokens_per_s"] > 0 and math.isfinite(res["tokens_per_s"])
    assert res["microbatches"] == (4 if "pp" in job.name else 2)


def test_ep_moe_needs_an_even_split():
    from oracle.benchmark.spec import LayerSpec
    spec = LayerSpec(kind="moe", hidden=16, mbs=1, seq_q=5, seq_k=5, experts=2, router_experts=4, topk=1,
                     expert_ffn=8, heads=2, kv_heads=2, head_dim=8, ep_ranks=2)
    with pytest.raises(ValueError, match="divide evenly"):
        ep_moe(spec)


def test_runner_reports_measured_and_both_projections(monkeypatch, tmp_path):
    """The runner with a stubbed trainer: rows, errors and the ranking check are computed from what it measured."""
    fake = {"dense 1 proc": 1000.0, "dense DP=2": 1900.0, "dense PP=2 1F1B": 1500.0, "moe EP=2": 1200.0}
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", lambda job: {
        "tokens_per_s": fake[job.name], "iteration_s": 1.0, "iteration_times_s": [1.0]})
    res = runner.run_e2e(profile="cpu-host", cache_dir=str(tmp_path), repeats=1, iterations=1, rounds=1,
                         seq_len=64, log=lambda *a: None)
    assert [r["name"] for r in res["runs"]] == list(fake)
    for r in res["runs"]:
        assert r["measured_tokens_per_s"] == fake[r["name"]]
        assert r["benchmark_projected"] > 0 and r["simulate_projected"] > 0
        assert r["benchmark_error"] == pytest.approx(r["benchmark_projected"] / r["measured_tokens_per_s"] - 1)
    assert isinstance(res["benchmark_same_ranking"], bool)
    assert set(res["runs"][0]) >= {"name", "config", "measured_tokens_per_s", "benchmark_projected",
                                   "simulate_projected"}



def test_calibrating_two_processes_measures_the_link_and_the_per_collective_cost(tmp_path):
    import yaml

    from oracle.benchmark.calibrate import calibrate
    from oracle.hardware import profile_from_dict
    data, raw = calibrate(base="cpu-host", name="two", world=2, threads=1, device="cpu")
    links = raw["links"]
    assert links["latency_s"] > 0 and links["bandwidth_bytes_per_s"] > 0
    # the probe is a real mean of all-to-alls issued between compute; the per-call cost is what exceeds the link
    assert links["collective_between_compute_s"] > 0
    assert links["collective_launch_s"] == pytest.approx(max(0.0, links["collective_between_compute_s"]
                                                             - links["latency_s"] - 16384 / links["bandwidth_bytes_per_s"]))
    hw = profile_from_dict(yaml.safe_load(yaml.safe_dump(data)), "two")
    assert hw.scale_up_domain_size == 2
    assert hw.efficiency.collective_launch_s == pytest.approx(float(f"{links['collective_launch_s']:.3g}"))
    assert "all-to-all issued after" in data["efficiency"]["collective_launch_s"]["source"]


def test_runner_pairs_each_run_with_the_benchmark_of_its_own_round(monkeypatch, tmp_path):
    """Per run, the reported measurement is the fastest round's and the projection is the one made from the
    benchmark of that same round; every round's error is kept."""
    calls: dict[str, int] = {}

    def fake_run(job):
        calls[job.name] = calls.get(job.name, 0) + 1
        tok = {1: 1000.0, 2: 3000.0, 3: 2000.0}[calls[job.name]]  # round 2 is the fastest
        return {"tokens_per_s": tok, "iteration_s": 1.0, "iteration_times_s": [1.0]}
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", fake_run)
    res = runner.run_e2e(profile="cpu-host", cache_dir=str(tmp_path), repeats=1, iterations=1, rounds=3,
                         seq_len=64, log=lambda *a: None)
    for r in res["runs"]:
        assert r["measured_tokens_per_s"] == 3000.0 and len(r["round_errors"]) == 3
        assert r["benchmark_error"] == pytest.approx(r["round_errors"][1])
