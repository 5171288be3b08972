"""Faults mid-experiment: a killed driver resumed with Tuner.restore, and a lost node."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.raytune_primus.conftest import SmallCapEvaluator

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


class Slow:
    """Trial hook: every trial takes at least ``s`` seconds (so there is a 'mid-experiment')."""

    def __init__(self, s: float) -> None:
        self.s = s

    def __call__(self, config) -> None:
        time.sleep(self.s)


def small_experiment():
    from searchers.experiment import load_experiment

    restrict = {"tp": [1, 2], "pp": [1, 2], "vpp": [1, 2], "ep": [1, 2], "mbs": [1, 2],
                "pp_schedule": ["1f1b", "interleaved"], "recompute": ["none", "full"], "precision": ["bf16", "fp8"]}
    pins = {"cp": 1, "fsdp": False, "use_distributed_optimizer": True, "moe_a2a_backend": "alltoall"}
    return load_experiment("tiny-moe-h100-8").with_changes(name="tiny-small", restrict=restrict, pins=pins)


DRIVER = """
import sys
import ray
from raytune_primus.runtime import NAMESPACE
ray.init(address=sys.argv[1], namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
from raytune_primus.tuner import run_tune
from tests.raytune_primus.conftest import SmallCapEvaluator
from tests.raytune_primus.test_faults import Slow, small_experiment
run_tune(small_experiment(), sys.argv[2], searcher="random", budget=int(sys.argv[3]), seed=5,
         evaluator=SmallCapEvaluator(), max_concurrent=2, hook=Slow(0.4), progress=True)
"""


def _counted(path: Path) -> list[dict]:
    from searchers.ledger import read_rows
    return [r for r in read_rows(path) if r["trial_index"] >= 0] if path.exists() else []


def _wait_for_rows(path: Path, n: int, timeout_s: float, proc: subprocess.Popen | None = None) -> list[dict]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            rows = _counted(path)
        except Exception:  # a reader racing the atomic replace: try again
            rows = []
        if len(rows) >= n:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"ledger {path} did not reach {n} trials in {timeout_s} s")


def _tune_keys(experiment_path: str) -> list[str]:
    from ray.tune import ExperimentAnalysis
    ea = ExperimentAnalysis(experiment_path)
    return sorted(t.last_result["config_key"] for t in ea.trials if t.status == "TERMINATED")


def test_killed_driver_resumes_with_tuner_restore_losing_and_repeating_nothing(cluster, tmp_path):
    from raytune_primus.runtime import ray_environment
    from raytune_primus.tuner import run_tune

    budget = 10
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = ray_environment()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen([sys.executable, str(script), cluster.address, str(tmp_path / "res"), str(budget)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        before = _wait_for_rows(tmp_path / "res" / "ledger.parquet", 4, 120, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # our own driver's process group only
        proc.wait(30)
        log.close()
    before = _counted(tmp_path / "res" / "ledger.parquet")
    assert 4 <= len(before) < budget, (tmp_path / "driver.log").read_text()[-3000:]

    out = run_tune(small_experiment(), tmp_path / "res", searcher="random", budget=budget, seed=5,
                   evaluator=SmallCapEvaluator(), max_concurrent=2, progress=False)
    assert out.resumed == len(before)
    print("restore:", len(before), "before the kill;", out.tune.scorers, "tune trials", out.tune.tune_trials,
          "set aside:", out.tune.set_aside)
    after = _counted(tmp_path / "res" / "ledger.parquet")
    assert after[:len(before)] == before, "rows written before the kill are kept as they were"
    assert sorted(r["trial_index"] for r in after) == list(range(budget)), "nothing lost, nothing counted twice"
    assert len({r["config_key"] for r in after}) == budget, "no configuration scored twice"
    scored = [r for r in after if r["status"] != "rejected"]
    if out.tune.set_aside is None:  # Tune's state and the ledger agree: every scored trial is a finished Tune trial
        assert out.tune.restored
        assert _tune_keys(out.tune.experiment_path) == sorted(r["config_key"] for r in scored)
    else:  # the kill cut Tune's copy of its state short: a fresh Tune run scored only what the ledger lacked
        assert not out.tune.restored
        assert _tune_keys(out.tune.experiment_path) == sorted(r["config_key"] for r in scored[len(before):]
                                                              if r["trial_index"] >= len(before))
    # and the resumed run tried what an uninterrupted in-process run tries (random is not adaptive)
    from searchers.driver import run_search
    ref = run_search(small_experiment(), "random", budget, 5, tmp_path / "ref.parquet", evaluator=SmallCapEvaluator())
    assert sorted(r["config_key"] for r in after) == sorted(r["config_key"] for r in _counted(tmp_path / "ref.parquet"))
    assert out.best_so_far[-1] == ref.best_so_far[-1]


def test_unreadable_tune_state_is_set_aside_and_the_ledger_resumes_the_search(cluster, tmp_path):
    """A driver killed while Ray copies its state leaves a truncated file (Ray's copy is not atomic; seen: a
    0-byte search_gen_state-*.json, and Tuner.restore then fails): the run is set aside, nothing is re-scored."""
    from raytune_primus.tuner import run_tune, unreadable_tune_state

    budget = 6
    first = run_tune(small_experiment(), tmp_path / "res", searcher="random", budget=budget, seed=5,
                     evaluator=SmallCapEvaluator(), max_concurrent=2, progress=False)
    rows = _counted(tmp_path / "res" / "ledger.parquet")
    exp_path = Path(first.tune.experiment_path)
    assert unreadable_tune_state(exp_path) == []
    (state,) = exp_path.glob("search_gen_state-*.json")
    state.write_bytes(b"")

    assert unreadable_tune_state(exp_path) == [state]
    with pytest.warns(UserWarning, match="search_gen_state-.*resumes from the ledger"):
        out = run_tune(small_experiment(), tmp_path / "res", searcher="random", budget=budget, seed=5,
                       evaluator=SmallCapEvaluator(), max_concurrent=2, progress=False)
    assert not out.tune.restored and state.name in out.tune.set_aside
    assert (tmp_path / "res" / "tune.unreadable-1" / state.name).exists(), "set aside, not deleted"
    assert out.resumed == budget and out.tune.tune_trials == 0, "every trial answered from the ledger"
    assert _counted(tmp_path / "res" / "ledger.parquet") == rows
    assert out.best_so_far == first.best_so_far


@pytest.mark.parametrize("name,data", [
    ("experiment_state-x.json", b'{"trials": [1, 2'), ("search_gen_state-x.json", b""),
    ("search_gen_state-x.json", __import__("pickle").dumps({"a": list(range(100))})[:-7]),
    ("searcher-state-x.pkl", b'{"run_id": "x", "pen'), ("tuner.pkl", b"")])
def test_truncated_state_files_are_found(tmp_path, name, data):
    import pickle

    from raytune_primus.tuner import unreadable_tune_state

    (tmp_path / "experiment_state-a.json").write_text('{"ok": 1}')  # older: not what Tune would read
    (tmp_path / "search_gen_state-a.json").write_bytes(pickle.dumps([1, 2, 3]))  # Tune's: a pickle
    (tmp_path / "searcher-state-a.pkl").write_text('{"run_id": "x"}')  # ours: JSON
    assert unreadable_tune_state(tmp_path) == []
    (tmp_path / name).write_bytes(data)
    assert unreadable_tune_state(tmp_path) == [tmp_path / name]


class PauseAt:
    """Trial hook: the ``nth`` trial to start waits until the test has killed a node (files as flags)."""

    def __init__(self, folder: Path, nth: int) -> None:
        self.folder, self.nth = Path(folder), nth

    def __call__(self, config) -> None:
        import uuid
        (self.folder / f"start-{uuid.uuid4().hex}").touch()
        if len(list(self.folder.glob("start-*"))) == self.nth:
            (self.folder / "paused").touch()
            deadline = time.time() + 60
            while not (self.folder / "killed").exists() and time.time() < deadline:
                time.sleep(0.05)
        time.sleep(0.1)


def test_a_node_lost_mid_experiment_loses_no_trial(cluster, tmp_path):
    import ray

    from raytune_primus.tuner import run_tune

    # no CPU: only a scorer (num_cpus=0, SPREAD) lands there, never a Tune trial actor. A trial actor lost with
    # its node is Tune's FailureConfig retry (test_tune's KillOnce); Tune may place that retry on the lost node
    # before Ray has declared it dead, and a few failed creations there use up max_failures in seconds
    # (seen once in CI): the failed trial is then recorded with its reason, not redone.
    extra = cluster.add_node(num_cpus=0, resources={"doomed": 1})
    cluster.wait_for_nodes()
    flags = tmp_path / "flags"
    flags.mkdir()

    def kill_when_paused() -> None:
        deadline = time.time() + 120
        while not (flags / "paused").exists() and time.time() < deadline:
            time.sleep(0.05)
        cluster.remove_node(extra, allow_graceful=False)
        # let Ray declare the node dead first: until then it may still place a retried trial there
        deadline = time.time() + 60
        while time.time() < deadline and any(n["NodeID"] == extra.node_id and n["Alive"] for n in ray.nodes()):
            time.sleep(0.2)
        (flags / "killed").touch()

    t = threading.Thread(target=kill_when_paused, daemon=True)
    t.start()
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    # no memory rejections (a generous cap): all 10 trials reach the scorers, 8 of them after the loss; the
    # doomed node's scorer dies with it and the pool serves its request on another
    out = run_tune(small_experiment(), tmp_path, searcher="random", budget=10, seed=7,
                   evaluator=SmallCapEvaluator(cap_bytes=64 * 2**30), max_concurrent=2, num_scorers=nodes,
                   hook=PauseAt(flags, 2), progress=False, max_failures=3)
    t.join(5)
    assert (flags / "killed").exists()
    counted = _counted(tmp_path / "ledger.parquet")
    assert sorted(r["trial_index"] for r in counted) == list(range(10))
    failed = [r["reason"] for r in counted if r["status"] == "failed"]
    assert not failed, f"the lost node's work was redone elsewhere: {failed}"
    assert out.tune.scorers["dropped"] == 1, out.tune.scorers  # its scorer was dropped, the request served by another
    assert _tune_keys(out.tune.experiment_path) == sorted(r["config_key"] for r in counted if r["status"] != "rejected")


# ---------------------------------------------------------------------------------- actors killed mid-batch
class DiesOnce(SmallCapEvaluator):
    """Kills the process it scores in (an oracle actor) at its ``nth`` scoring, once per marker file."""

    def __init__(self, marker: Path, nth: int = 3, only_in: str | None = None, **kw) -> None:
        super().__init__(**kw)
        self.marker, self.nth, self.only_in, self.calls = str(marker), nth, only_in, 0

    def _armed(self) -> bool:
        if self.only_in is None:
            return True
        f = sys._getframe()
        while f is not None:  # only inside a search (not the comparison's exhaustive sweep)
            if f.f_code.co_name == self.only_in:
                return True
            f = f.f_back
        return False

    def score(self, run):
        if self._armed():
            self.calls += 1
            if self.calls == self.nth and not os.path.exists(self.marker):
                Path(self.marker).write_text(str(os.getpid()))
                os._exit(1)  # the actor's process dies in the middle of its batch
        return super().score(run)


class Bounded(SmallCapEvaluator):
    """The synthetic oracle with a provable throughput bound (its value x1.1): swept by branch and bound."""

    def throughput_bound(self, run):
        return 1.1 * super().score(run).tokens_per_s_per_gpu


class Poison(Bounded):
    """Kills every process that scores (``where='score'``) or bounds (``where='bound'``) one particular
    configuration; the other step of that configuration is fine."""

    def __init__(self, key: str, where: str = "score", **kw) -> None:
        super().__init__(**kw)
        self.key, self.where = key, where

    def _die_at(self, where: str, run) -> None:
        if where == self.where and run.key() == self.key:
            os._exit(1)

    def score(self, run):
        self._die_at("score", run)
        return super().score(run)

    def throughput_bound(self, run):
        self._die_at("bound", run)
        return super().throughput_bound(run)


def test_an_actor_killed_mid_batch_loses_no_candidate(cluster, small, tmp_path):
    from raytune_primus.pool import ScoringPool, score_in_process

    points = [dict(zip(small.space.axes, p)) for p in small.space.points]
    ev = DiesOnce(tmp_path / "died", nth=3, cap_bytes=64 * 2**30)
    ref = score_in_process(SmallCapEvaluator(cap_bytes=64 * 2**30), small.space.baseline, points, prefilter=True)
    with ScoringPool(ev, small.space.baseline, num_actors=2, batch_size=8) as pool:
        got = pool.evaluate(points)
        stats = (pool.dropped, pool.replaced, pool.retried, len(pool.actors), pool.failures)
    assert (tmp_path / "died").exists(), "an actor did die mid-batch"
    dropped, replaced, retried, actors, failures = stats
    assert dropped == replaced == retried >= 1 and actors == 2 and failures == [], stats  # replaced, re-run
    assert got == ref, "every candidate scored, in order, as in-process"


def test_a_candidate_that_kills_every_actor_is_recorded_failed_with_the_reason(cluster, small):
    from raytune_primus.pool import ScoringPool, score_in_process

    points = [dict(zip(small.space.axes, p)) for p in small.space.points][:24]
    base = SmallCapEvaluator(cap_bytes=64 * 2**30)
    ref = score_in_process(base, small.space.baseline, points, prefilter=True)
    bad = ref[5].key
    with ScoringPool(Poison(bad, cap_bytes=64 * 2**30), small.space.baseline, num_actors=2, batch_size=6,
                     max_retries=1) as pool:
        got = pool.evaluate(points)
        failures = list(pool.failures)
    assert got[5].status == "failed" and got[5].key == bad and got[5].training == ref[5].training
    assert "the oracle actor scoring it died 2 times" in got[5].reason and "given up after 1 retries" in got[5].reason
    assert got[:5] + got[6:] == ref[:5] + ref[6:], "every other candidate scored normally"
    assert len(failures) == 1


def test_the_pool_branch_and_bound_survives_a_point_that_kills_every_actor_bounding_it(cluster, small, monkeypatch):
    """A point whose bound kills every actor that computes it is given up on with an infinite bound, so it is
    projected: the optimum, its point and the candidate count are those of the in-process branch and bound."""
    from raytune_primus.pool import ScoringPool, sweep_optimum
    from searchers import driver

    monkeypatch.setattr(driver, "_OPTIMA", {})
    cap = 1.58 * 2**30
    ref = driver.exhaustive_optimum(small.space, Bounded(cap_bytes=cap), jobs=1)
    assert ref["method"] == "branch-and-bound" and ref["upper_bound_tokens_per_s_per_gpu"] is not None
    best = small.space.run_of(tuple(ref["point"][a] for a in small.space.axes)).key()
    with ScoringPool(Poison(best, "bound", cap_bytes=cap), small.space.baseline, num_actors=2, batch_size=5,
                     max_retries=1) as pool:
        got = sweep_optimum(pool, small.space)
        failures = list(pool.failures)
    keys = ("tokens_per_s_per_gpu", "point", "config", "scored", "method")
    assert {k: got[k] for k in keys} == {k: ref[k] for k in keys}
    assert got["upper_bound_tokens_per_s_per_gpu"] is None  # one candidate has no finite bound
    assert len(failures) == 1 and "died 2 times" in failures[0]


def test_compare_with_an_actor_killed_mid_search_equals_the_uninterrupted_compare(cluster, small, tmp_path,
                                                                                 monkeypatch):
    from raytune_primus.tuner import compare_on_ray
    from searchers import driver
    from searchers.driver import compare
    from searchers.ledger import read_rows

    monkeypatch.setattr(driver, "_OPTIMA", {})  # no optimum memoised for another test's oracle

    kw = {"budget": 8, "seeds": [0, 1], "searchers": ["random", "tpe"]}
    ref = compare(small, evaluator=SmallCapEvaluator(), ledger_path=tmp_path / "ref.parquet", **kw)
    ev = DiesOnce(tmp_path / "died", nth=4, only_in="run_search")
    got = compare_on_ray(small, evaluator=ev, ledger_path=tmp_path / "ray.parquet", num_actors=2, **kw)
    assert (tmp_path / "died").exists(), "a search's actor did die mid-search"

    def trials(path):
        return sorted((r["run_id"], r["config_key"], r["status"], r["tokens_per_s_per_gpu"])
                      for r in read_rows(path) if r["trial_index"] is not None and r["trial_index"] >= 0)

    assert trials(tmp_path / "ray.parquet") == trials(tmp_path / "ref.parquet"), "nothing lost or scored twice"
    assert {n: v["regrets"] for n, v in got["searchers"].items()} == \
        {n: v["regrets"] for n, v in ref["searchers"].items()}
