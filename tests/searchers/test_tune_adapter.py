"""The Ray Tune adapter, in a tiny in-process Tune run; and nothing else under searchers/ imports ray."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from searchers.ledger import read_rows
from searchers.testing import SyntheticEvaluator

from .conftest import CAP_BYTES

ROOT = Path(__file__).resolve().parents[2]


def test_no_searcher_module_but_the_adapter_imports_ray():
    mods = [p.stem for p in (ROOT / "searchers").glob("*.py") if p.stem not in ("__init__", "tune_adapter")]
    code = ("import sys\n" + "".join(f"import searchers.{m}\n" for m in mods) +
            "from searchers.base import available; available()\n"
            "bad = [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    text = "".join((ROOT / "searchers" / f"{m}.py").read_text() for m in mods)
    assert "import ray" not in text and "from ray" not in text


def _trainable(config):
    from ray import tune

    from oracle.config import RunConfig
    from searchers.evaluator import score_result, trial_metrics
    from searchers.testing import SyntheticEvaluator
    run = RunConfig.from_dict(config["run"])
    res = score_result(SyntheticEvaluator(cap_bytes=config["cap_bytes"]), run, config["config_key"])
    tune.report(trial_metrics(res))


@pytest.mark.ray
def test_tiny_tune_run_matches_the_ledger(small, tmp_path):
    ray = pytest.importorskip("ray")
    from ray import tune

    from searchers.tune_adapter import PrimusSearcher
    ledger = tmp_path / "ledger.parquet"
    alg = PrimusSearcher(small, "seed_llm", budget=6, seed=0, ledger_path=ledger,
                         evaluator=SyntheticEvaluator(cap_bytes=CAP_BYTES))
    assert alg.metric == "tokens_per_s_per_gpu" and alg.mode == "max"
    alg.set_search_properties(None, None, {"cap_bytes": CAP_BYTES})
    assert alg.metric == "tokens_per_s_per_gpu"          # never dropped
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(_trainable, param_space={"cap_bytes": CAP_BYTES},
                           tune_config=tune.TuneConfig(search_alg=alg, num_samples=6, reuse_actors=True),
                           run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0))
        grid = tuner.fit()
    finally:
        ray.shutdown()
    assert not grid.errors
    rows = read_rows(ledger)
    counted = [r for r in rows if r["trial_index"] >= 0]
    assert len(counted) == 6 == alg.book.used
    scored = {r["config_key"]: r["tokens_per_s_per_gpu"] for r in counted if r["status"] == "ok"}
    tune_results = {r.config["config_key"]: r.metrics["tokens_per_s_per_gpu"] for r in grid}
    assert set(scored) == {k for k, v in tune_results.items() if v > 0}
    for k, v in scored.items():
        assert tune_results[k] == pytest.approx(v)
    # rejected candidates never became Tune trials
    assert len(grid) == len(scored) + sum(r["status"] == "failed" for r in counted)
    # pickling keeps the recipe and resumes from the ledger
    again = pickle.loads(pickle.dumps(alg))
    assert again.book.used == 6 and again.book.resumed == 6
