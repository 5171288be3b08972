"""The CPU end-to-end trainer really trains in several gloo processes (DDP, pipelining 1F1B, EP all-to-all), and
the e2e runner projects each run from a single-process benchmark. Accuracy is not asserted here: it needs a
quiet machine (docs/benchmark.md); this checks that every path runs and reports what it should."""
import math

import pytest

torch = pytest.importorskip("torch")

from oracle.benchmark.dtype import choose_dtype  # noqa: E402
from oracle.benchmark.load import LoadMonitor, LoadSeen  # noqa: E402
from raytune_primus.e2e import runner  # noqa: E402
from raytune_primus.e2e.trainer import TrainJob, ep_moe, run_job  # noqa: E402

pytestmark = pytest.mark.slow

BASE = {"seq_len": 64, "mbs": 1, "use_distributed_optimizer": False, "pp_schedule": "1f1b"}
NATIVE = choose_dtype(torch.device("cpu")).dtype


def _job(name, model, gpus, **tr):
    return TrainJob(name=name, config={"model": model, "cluster": {"hardware": "cpu-host", "num_gpus": gpus},
                                       "training": {**BASE, **tr}}, warmup=1, iterations=2, dtype=NATIVE)


class _Monitor(LoadMonitor):
    """Others' load as scripted: idle windows at ``idle`` cores, each measured pair at the next ``pairs`` value
    (then 0): the runner's decisions without depending on who else uses this machine."""

    idle_load = 0.0
    pairs: list = []

    def idle(self, window_s=3.0):
        return LoadSeen(wall_s=window_s, other_cores=self.idle_load, own_cores=0, steal_cores=0, cpus=2)

    def since(self, mark):
        v = type(self).pairs.pop(0) if type(self).pairs else 0.0
        seen = LoadSeen(wall_s=1.0, other_cores=v, own_cores=1, steal_cores=0, cpus=2)
        self.seen.append(seen)
        return seen


@pytest.fixture
def monitor(monkeypatch):
    monkeypatch.setattr(runner, "LoadMonitor", _Monitor)
    monkeypatch.setattr(_Monitor, "pairs", [])
    monkeypatch.setattr(_Monitor, "idle_load", 0.0)
    return _Monitor


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
    # each rank trained on its own data: only the gradient all-reduce keeps the replicas' weights equal
    assert res["replicas_in_sync"] is (None if "pp" in job.name else True)


def test_ep_moe_needs_an_even_split():
    from oracle.benchmark.spec import LayerSpec
    spec = LayerSpec(kind="moe", hidden=16, mbs=1, seq_q=5, seq_k=5, experts=2, router_experts=4, topk=1,
                     expert_ffn=8, heads=2, kv_heads=2, head_dim=8, ep_ranks=2)
    with pytest.raises(ValueError, match="divide evenly"):
        ep_moe(spec)


def test_runner_reports_measured_and_both_projections(monkeypatch, tmp_path, monitor):
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
    assert res["verdict"] in ("PASS", "FAIL") and res["compute_dtype"]["dtype"] == NATIVE
    assert res["load"]["measured"]["intervals"] == 4 and res["load"]["measured"]["busy_intervals"] == 0
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


def test_runner_reports_the_median_of_each_side_over_the_rounds(monkeypatch, tmp_path, monitor):
    """Per run, the reported measurement is the median over the rounds of the measured tokens/s, and the
    projection the median of the projections each round's own benchmark made; every round's error is kept."""
    calls: dict[str, int] = {}

    def fake_run(job):
        calls[job.name] = calls.get(job.name, 0) + 1
        tok = {1: 1000.0, 2: 3000.0, 3: 2000.0}[calls[job.name]]  # round 3's is the median
        return {"tokens_per_s": tok, "iteration_s": 1.0, "iteration_times_s": [1.0]}
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", fake_run)
    res = runner.run_e2e(profile="cpu-host", cache_dir=str(tmp_path), repeats=1, iterations=1, rounds=3,
                         seq_len=64, log=lambda *a: None)
    for r in res["runs"]:
        assert r["measured_tokens_per_s"] == 2000.0 and len(r["round_errors"]) == 3
        assert r["measured_range_tokens_per_s"] == [1000.0, 3000.0] and r["reported_rounds"] == [1, 2, 3]
        projected = sorted((1 + e) * t for e, t in zip(r["round_errors"], (1000.0, 3000.0, 2000.0)))
        assert r["benchmark_projected"] == pytest.approx(projected[1])


def _rows(*runs):
    return [{"name": n, "measured_tokens_per_s": (lo + hi) / 2, "measured_range_tokens_per_s": [lo, hi],
             "benchmark_projected": p} for n, lo, hi, p in runs]


def test_the_ranking_is_judged_on_the_pairs_the_rounds_order():
    # b and c overlap over the rounds: either projected order agrees with the measurement; a is above both
    rows = _rows(("a", 900, 1000, 10.0), ("b", 500, 600, 5.0), ("c", 550, 650, 6.0))
    ok, ties = runner.ranking_resolved(rows, "benchmark_projected")
    assert ok and ties == [["b", "c"]]
    ok, _ = runner.ranking_resolved(_rows(("a", 900, 1000, 10.0), ("b", 500, 600, 6.0), ("c", 550, 650, 5.0)),
                                    "benchmark_projected")
    assert ok
    # a pair the rounds do order, projected the other way round, fails
    ok, ties = runner.ranking_resolved(_rows(("a", 900, 1000, 4.0), ("b", 500, 600, 5.0)), "benchmark_projected")
    assert not ok and ties == []
    # one round: points, so the strict order
    ok, ties = runner.ranking_resolved(_rows(("a", 600, 600, 4.0), ("b", 599, 599, 5.0)), "benchmark_projected")
    assert not ok and ties == []


def _fake_trainer(monkeypatch, tok=lambda job, n: 1000.0):
    calls = []

    def fake_run(job):
        calls.append(job)
        return {"tokens_per_s": tok(job, sum(c.name == job.name for c in calls)), "iteration_s": 1.0,
                "iteration_times_s": [1.0] * job.iterations}
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", fake_run)
    return calls


def _run(tmp_path, **kw):
    args = dict(profile="cpu-host", cache_dir=str(tmp_path), repeats=1, iterations=4, rounds=1, seq_len=64,
                wait_s=0, log=lambda *a: None)
    return runner.run_e2e(**{**args, **kw})


def test_a_pair_measured_under_load_is_measured_again_and_never_reported(monkeypatch, tmp_path, monitor):
    """The DP=2 pair sees other load: it is measured again after a wait for quiet; the busy pair, though its run
    was the fastest, stays out of the result (its error is kept)."""
    monitor.pairs = [0.0, 1.2, 0.0, 0.0, 0.0]  # 1 proc, DP=2 (busy), DP=2 again, PP=2, EP=2
    calls = _fake_trainer(monkeypatch, tok=lambda job, n: 5000.0 if (job.name == "dense DP=2" and n == 1) else 1000.0)
    res = _run(tmp_path)
    assert [c.name for c in calls].count("dense DP=2") == 2
    dp = next(r for r in res["runs"] if r["name"] == "dense DP=2")
    assert dp["round_busy"] == [True, False] and len(dp["round_errors"]) == 2
    assert dp["measured_tokens_per_s"] == 1000.0 and not dp["reported_busy"]
    assert res["verdict"] != "NOT VALID (measured under other load)"


def test_a_machine_that_never_goes_quiet_is_refused_unless_allowed(monkeypatch, tmp_path, monitor):
    monitor.idle_load = 1.0
    calls = _fake_trainer(monkeypatch)
    with pytest.raises(runner.BusyMachine, match="machine busy before starting: others used 1.00 .*--allow-busy"):
        _run(tmp_path)
    assert not calls
    monitor.pairs = [1.0] * 4
    res = _run(tmp_path, allow_busy=True)
    assert res["verdict"] == "NOT VALID (measured under other load)" and all(r["reported_busy"] for r in res["runs"])
    assert len(calls) == 4  # allowed: nothing is measured twice


def test_busy_pairs_with_no_quiet_round_stop_the_check(monkeypatch, tmp_path, monitor):
    monitor.pairs = [0.0, 1.0, 1.0, 0.0, 0.0]  # DP=2 busy twice
    _fake_trainer(monkeypatch)
    with pytest.raises(runner.BusyMachine, match="busy in every round of dense DP=2"):
        _run(tmp_path)


def test_the_work_is_sized_to_the_budget(monkeypatch, tmp_path, monitor):
    """A budget the first round exceeds: one round, each run at the fewest iterations; an ample one: every round
    asked for, at the most iterations."""
    calls = _fake_trainer(monkeypatch)
    res = _run(tmp_path, rounds=3, budget_s=1e-3)
    assert res["rounds"] == 1 and "1 round(s) of 3 fit" in res["rounds_note"]
    assert {c.iterations for c in calls} == {runner.MIN_ITERATIONS}
    calls.clear()
    res = _run(tmp_path, rounds=2, budget_s=1e6, iterations=5)
    assert res["rounds"] == 2 and not res["rounds_note"] and {c.iterations for c in calls} == {5}


def test_size_iterations_takes_the_pairs_share_of_the_time_left():
    kw = dict(pairs_left=4, projected_iteration_s=0.5, warmup=2, overhead_s=5.0, most=8)
    assert runner.size_iterations(left_s=100, **kw) == 8  # 25 s each: room for more than the most
    assert runner.size_iterations(left_s=40, **kw) == 8  # 10 s - 5 s start-up = 10 iterations, 2 of them warm-up
    assert runner.size_iterations(left_s=32, **kw) == 4  # 8 - 5 = 3 s: 6 iterations, 2 warm-up
    assert runner.size_iterations(left_s=4, **kw) == runner.MIN_ITERATIONS


def test_jobs_compute_in_the_dtype_and_price_fp32_gradients():
    for dtype in ("bf16", "fp32"):
        for job in runner.jobs("cpu-host", dtype=dtype):
            assert job.dtype == dtype
            assert job.config["training"].get("grad_reduce_in_fp32", False) == (dtype == "fp32")


def test_a_run_whose_processes_die_is_run_again_then_reported_in_one_line(monkeypatch, tmp_path, monitor):
    died = {"n": 0}

    def flaky(job):
        if job.name == "dense DP=2" and died["n"] < 1:
            died["n"] += 1
            raise RuntimeError("process 1 terminated with signal SIGABRT")
        return {"tokens_per_s": 1000.0, "iteration_s": 1.0, "iteration_times_s": [1.0] * job.iterations}
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", flaky)
    logged = []
    res = _run(tmp_path, log=logged.append)
    assert died["n"] == 1 and any("processes died (RuntimeError: process 1 terminated" in m for m in logged)
    assert next(r for r in res["runs"] if r["name"] == "dense DP=2")["measured_tokens_per_s"] == 1000.0

    def dead(job):
        raise RuntimeError("process 0 terminated with signal SIGABRT")
    monkeypatch.setattr("raytune_primus.e2e.trainer.run_job", dead)
    with pytest.raises(runner.TrainerFailed, match="^dense 1 proc: the trainer's processes died twice"):
        _run(tmp_path)


def test_a_run_measured_further_apart_than_the_bar_over_quiet_rounds_is_no_check(monkeypatch, tmp_path, monitor):
    """Quiet rounds whose measurements of one run differ by more than the bar allows (a machine whose speed moved
    without load the kernel sees): the verdict is not valid, whatever the errors."""
    _fake_trainer(monkeypatch, tok=lambda job, n: 1000.0 if n == 1 else 1500.0)
    res = _run(tmp_path, rounds=2)
    assert res["measured_max_spread"] == pytest.approx(0.5)
    assert res["verdict"].startswith("NOT VALID (machine speed unstable: dense 1 proc measured 50% apart")
    _fake_trainer(monkeypatch, tok=lambda job, n: 1000.0 if n == 1 else 1100.0)
    assert not _run(tmp_path, rounds=2)["verdict"].startswith("NOT VALID")
