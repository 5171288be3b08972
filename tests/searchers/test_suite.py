"""The experiment suite (searchers.suite) and the branch-and-bound optimum it relies on."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.errors import InvalidConfigError
from searchers import driver
from searchers.driver import _OPTIMA, compare, exhaustive_optimum
from searchers.experiment import load_experiment
from searchers.suite import SUITE, SUITE_GENERALISE, bar, format_suite_table, run_suite, suite_experiments
from searchers.testing import SyntheticEvaluator, brute_force_optimum

from .conftest import CAP_BYTES, small_experiment


class _BoundEverywhere(SyntheticEvaluator):
    """A provable bound for every point (a loose one for half of them), counting full projections."""

    def __init__(self, slack: float = 1.05):
        super().__init__(cap_bytes=CAP_BYTES)
        self.projected = 0
        self.slack = slack

    def throughput_bound(self, run):
        v = super().score(run).tokens_per_s_per_gpu
        return v * (self.slack if run.training.mbs % 2 else 1.0)

    def score(self, run):
        self.projected += 1
        return super().score(run)


@pytest.mark.parametrize("slack", [1.0, 1.05, 3.0])
def test_branch_and_bound_is_exact_and_projects_fewer_points(slack):
    exp = small_experiment()
    _OPTIMA.clear()
    ev = _BoundEverywhere(slack)
    out = exhaustive_optimum(exp.space, ev)
    _OPTIMA.clear()
    best, point = brute_force_optimum(exp.space, SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert out["tokens_per_s_per_gpu"] == pytest.approx(best)
    assert out["method"] == "branch-and-bound" and out["projected"] == ev.projected
    assert 0 < ev.projected < out["scored"]
    assert out["upper_bound_tokens_per_s_per_gpu"] >= best


def test_branch_and_bound_on_the_real_oracle_equals_the_plain_sweep():
    exp = load_experiment("tiny-moe-h100-8")

    class Plain(driver.OracleEvaluator):
        throughput_bound = None

        def __repr__(self):
            return "Plain()"
    _OPTIMA.clear()
    fast = exhaustive_optimum(exp.space, driver.OracleEvaluator("simulate"))
    plain = exhaustive_optimum(exp.space, Plain("simulate"))
    _OPTIMA.clear()
    assert fast["method"] == "branch-and-bound" and plain["method"] == "sweep"
    assert fast["tokens_per_s_per_gpu"] == plain["tokens_per_s_per_gpu"]
    assert fast["point"] == plain["point"]
    assert fast["projected"] < fast["scored"] / 10
    assert fast["upper_bound_tokens_per_s_per_gpu"] >= fast["tokens_per_s_per_gpu"]


def test_branch_and_bound_over_processes_equals_one_process(monkeypatch):
    """The memory checks and bounds split over forked processes give the same candidates, optimum, tie
    order and counts as one process."""
    exp = load_experiment("tiny-moe-h100-8")
    monkeypatch.setattr(driver, "PARALLEL_MIN_POINTS", 1)
    keys = ("tokens_per_s_per_gpu", "point", "config", "scored", "projected", "upper_bound_tokens_per_s_per_gpu")
    outs = []
    for jobs in (1, 2, 0):
        _OPTIMA.clear()
        out = exhaustive_optimum(exp.space, driver.OracleEvaluator("simulate"), jobs=jobs)
        outs.append({k: out[k] for k in keys})
        assert out["jobs"] == driver.cpu_jobs(jobs)
    _OPTIMA.clear()
    assert outs[0] == outs[1] == outs[2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 20), st.integers(0, 5), st.booleans(),
                                                   st.booleans())), max_size=60),
       st.integers(1, 70))
def test_best_by_bound_is_exact_whatever_the_block(points, block):
    """best_by_bound's optimum, its (lowest-index) tie order, candidate count and bound equal a brute-force
    sweep's for any block size: values at most their bounds (equal where the bound is tight), some points
    without a value (over the cap after the full projection) or without a finite bound."""
    bounds, values = [], []
    for p in points:
        if p is None:  # does not fit
            bounds.append(None)
            values.append(None)
            continue
        value, slack, no_value, no_bound = p
        bounds.append(math.inf if no_bound else float(value + slack))
        values.append(None if no_value else float(value))
    asked: list[int] = []

    def project(idx):
        asked.extend(idx)
        return [values[i] for i in idx]

    best, best_i, fitting, projected, top = driver.best_by_bound(bounds, project, block)
    scored = [(v, -i) for i, v in enumerate(values) if v is not None]
    assert (best, best_i) == ((max(scored)[0], -max(scored)[1]) if scored else (None, None))
    assert fitting == sum(b is not None for b in bounds)
    assert projected == len(asked) == len(set(asked)) and all(bounds[i] is not None for i in asked)
    finite = [b for b in bounds if b is not None]
    assert top == (max(finite) if finite and all(math.isfinite(b) for b in finite) else None)


def test_optimum_is_cached_on_disk_by_space_and_oracle(tmp_path):
    exp = load_experiment("tiny-moe-h100-8")
    _OPTIMA.clear()
    first = exhaustive_optimum(exp.space, driver.OracleEvaluator("simulate"), cache_dir=tmp_path)
    files = list(tmp_path.glob("optimum-*.json"))
    assert len(files) == 1 and exp.space.fingerprint in files[0].name
    _OPTIMA.clear()

    class Exploding(driver.OracleEvaluator):
        def score(self, run):
            raise AssertionError("a cached optimum must not be recomputed")
    again = exhaustive_optimum(exp.space, Exploding("simulate"), cache_dir=tmp_path)
    _OPTIMA.clear()
    assert again["tokens_per_s_per_gpu"] == first["tokens_per_s_per_gpu"] and again["point"] == first["point"]


def test_every_suite_experiment_loads_with_a_legal_baseline_and_a_searchable_space():
    exps = suite_experiments()
    assert [e.name for e in exps] == list(SUITE)
    gpus = [e.baseline.cluster.num_gpus for e in exps]
    assert min(gpus) == 8 and max(gpus) == 1024
    for e in exps:
        assert e.space.size > 100 and e.space.contains(e.space.point_of(e.space.baseline))
        assert "ilp" in e.space.values.get("pp_schedule", [])  # searched in search mode since issue 27


def test_the_generalisation_suite_spans_what_the_issue_asks():
    exps = suite_experiments(suite="generalise")
    assert [e.name for e in exps] == list(SUITE_GENERALISE) and len(exps) >= 12
    assert not set(SUITE_GENERALISE) & set(SUITE)
    gpus = [e.baseline.cluster.num_gpus for e in exps]
    assert min(gpus) == 8 and max(gpus) == 1024
    models = [e.baseline.model for e in exps]
    assert any(m.is_moe for m in models) and any(not m.is_moe for m in models)
    assert any(m.attention == "mla" for m in models)
    vendors = {e.baseline.cluster.hardware.vendor.lower() for e in exps}
    assert {"nvidia", "amd"} <= vendors
    for e in exps:
        assert e.space.size > 100 and e.space.contains(e.space.point_of(e.space.baseline))
        assert "ilp" in e.space.values.get("pp_schedule", [])


def test_unknown_suite_is_one_line():
    with pytest.raises(InvalidConfigError, match="unknown suite 'nope'; valid: bundled, generalise"):
        suite_experiments(suite="nope")


def test_suite_reports_regret_at_15_trials_and_the_first_trial_in_the_2pct_band():
    from searchers.suite import _best_within
    assert _best_within([1.0, 2.0, 3.0], 2) == 2.0 and _best_within([None, None], 15) is None
    assert _best_within([1.0, 2.0], 15) == 2.0  # a run that stopped early keeps its last best
    assert driver.trials_to_within([90.0, 97.0, 98.0, 100.0], 100.0) == 3  # 1-based, the band edge included
    assert driver.trials_to_within([90.0, 95.0], 100.0) is None


def test_unknown_suite_experiment_is_one_line():
    with pytest.raises(InvalidConfigError, match="unknown experiment 'nope'"):
        suite_experiments(["nope"])


def test_run_suite_on_a_tiny_subset_has_compare_keys_and_the_bar():
    ev = _BoundEverywhere(1.05)
    exp = small_experiment()

    def opt(e, evaluator):  # the suite names the experiment; the synthetic stand-in is what is searched
        return exhaustive_optimum(exp.space, evaluator)
    calls = []

    def compare_fn(e, budget, seeds, searchers, *, evaluator, optimum):
        calls.append(e.name)
        return compare(exp, budget, seeds, searchers, evaluator=evaluator, optimum=optimum)
    _OPTIMA.clear()
    out = run_suite(compare_fn, experiments=["tiny-moe-h100-8"], budget=12, seeds=[0, 1],
                    searchers=["seed_llm", "tpe", "random"], evaluator_for=lambda e: ev, optimum_fn=opt)
    _OPTIMA.clear()
    assert calls == ["tiny-moe-h100-8"]
    s = out["experiments"]["tiny-moe-h100-8"]
    plain = compare(exp, 12, [0, 1], ["seed_llm", "tpe", "random"], evaluator=ev)
    assert set(plain) <= set(s) and set(s["searchers"]) == {"seed_llm", "tpe", "random"}
    for name, r in s["searchers"].items():
        assert set(plain["searchers"][name]) <= set(r)
        assert r["median_regret"] == plain["searchers"][name]["median_regret"]
        assert r["median_regret_vs_bound"] >= r["median_regret"] - 1e-12
    b = out["bar"]["per_experiment"]["tiny-moe-h100-8"]
    r = s["searchers"]["seed_llm"]["median_regret"]
    assert s["upper_bound"] >= s["optimum"]["tokens_per_s_per_gpu"] and s["optimum_method"] == "branch-and-bound"
    assert b["within_1pct"] == (r <= 0.01) and set(b["beats"]) == {"tpe"}
    for name, r in s["searchers"].items():
        early = [max(0.0, 1.0 - max(v for v in c[:15] if v is not None) / s["optimum"]["tokens_per_s_per_gpu"])
                 for c in s["curves"][name]]
        assert r["regrets_at_15"] == pytest.approx(early) and r["median_regret_at_15"] >= r["median_regret"] - 1e-12
        assert len(r["trials_to_2pct"]) == 2
    assert b["seed_llm_median_regret_at_15"] == s["searchers"]["seed_llm"]["median_regret_at_15"]
    text = format_suite_table(out)
    assert "tiny-moe-h100-8" in text and "median regret" in text and "trials to 2%" in text and "regret @15" in text
    json.dumps(out, default=str)


def test_bar_needs_both_the_regret_and_the_rivals():
    def suite(sl, gp, tpe):
        return {"experiments": {"x": {"searchers": {"seed_llm": {"median_regret": sl}, "gp": {"median_regret": gp},
                                                    "tpe": {"median_regret": tpe}}}}}
    assert bar(suite(0.005, 0.02, 0.03))["met_on"] == 1
    assert bar(suite(0.02, 0.05, 0.05))["met_on"] == 0  # above 1%
    assert bar(suite(0.005, 0.001, 0.03))["met_on"] == 0  # GP better
    assert bar(suite(0.0, 0.0, 0.0))["met_on"] == 1  # all at the optimum: a tie at zero counts
    assert not math.isnan(bar(suite(None, 0.1, 0.1))["of"])
    late = suite(0.0, 0.1, 0.1)
    late["experiments"]["x"]["searchers"]["seed_llm"]["median_regret_at_15"] = 0.03
    assert bar(late)["met_on"] == 0  # at the optimum by 30 trials, but not within 2% after 15
    late["experiments"]["x"]["searchers"]["seed_llm"]["median_regret_at_15"] = 0.02
    assert bar(late)["met_on"] == 1


def test_cli_suite_json_on_a_tiny_subset(capsys, tmp_path, monkeypatch):
    from raytune_primus import cli
    monkeypatch.setattr("searchers.suite.DEFAULT_OPTIMA_CACHE", tmp_path)
    code = cli.main(["compare", "--suite", "--experiments", "tiny-moe-h100-8", "--seeds", "2", "--budget", "6",
                     "--searchers", "seed_llm", "random", "--driver", "inprocess", "--format", "json", "--quiet"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    s = out["experiments"]["tiny-moe-h100-8"]
    assert set(s) >= {"optimum", "space_size", "searchers", "curves", "experiment", "budget", "seeds"}
    assert s["budget"] == 6 and s["seeds"] == [0, 1] and s["gpus"] == 8
    assert list(tmp_path.glob("optimum-*.json"))


@pytest.mark.parametrize("argv,msg", [
    (["compare", "--suite", "tiny-moe-h100-8"], "takes no experiment"),
    (["compare", "--suite", "nope"], "takes a suite name (bundled, generalise), not 'nope'"),
    (["compare", "--experiments", "tiny-moe-h100-8"], "only applies with --suite"),
    (["compare"], "needs an experiment"),
    (["compare", "--suite", "--experiments", "nope", "--driver", "inprocess"], "unknown experiment"),
])
def test_cli_suite_bad_input_is_one_line_exit_2(argv, msg, capsys):
    from raytune_primus import cli
    assert cli.main(argv) == 2
    assert msg in capsys.readouterr().err


def test_seed_llm_behind_a_memory_wall_spends_no_seed_trial_on_rejections():
    # the published 1,024-GPU Llama 3.1 405B layout does not fit on 512 H100s, nor do most moves from it
    exp = load_experiment("llama3.1-405b-h100-512")
    res = driver.run_search(exp, "seed_llm", 12, 0, evaluator=driver.OracleEvaluator("simulate"))
    assert res.prefilter_rejections == 1  # the baseline itself, always tried
    # the guided proposer takes over at the first fitting point and probes every candidate before its trial
    assert res.proposer_stats["probes"] > 0 and res.proposer_trials["seed-planner"] >= 2
    assert res.best_tokens_per_s_per_gpu is not None
    rounds = driver.run_search(exp, "seed_llm", 12, 0, evaluator=driver.OracleEvaluator("simulate"),
                               options={"offline": "rounds"})
    assert rounds.prefilter_rejections == 1 and rounds.proposer_stats["seed_memory_skips"] > 0
    again = driver.run_search(exp, "seed_llm", 12, 0, evaluator=driver.OracleEvaluator("simulate"))
    assert again.best_so_far == res.best_so_far and again.best_key == res.best_key  # deterministic
