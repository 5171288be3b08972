"""``raytune-primus tune`` / ``compare``: output shapes, errors as one line and exit 2, Ray only when used."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMING_KEYS = {"wall_s", "optimum_wall_s", "driver", "ray", "ledger", "plot", "plots", "report"}
"""Keys that differ by run (times, where the files went), not by what the comparison found."""


def _cli(argv, capsys):
    from raytune_primus.cli import main
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_building_the_parser_does_not_import_ray():
    code = ("import sys; from raytune_primus.cli import build_parser; p = build_parser(); "
            "p.parse_args(['tune', 'x']); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_tune_inprocess_prints_the_winner_and_the_ledger(tmp_path, capsys):
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--driver", "inprocess", "--budget", "5",
                           "--results", str(tmp_path), "--format", "json"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert s["trials_run"] == 5 and s["driver"] == "inprocess"
    assert s["winner"]["projection"]["tokens_per_s_per_gpu"] == s["winner"]["tokens_per_s_per_gpu"]
    assert Path(s["ledger"]) == tmp_path / "ledger.parquet" and Path(s["ledger"]).exists()
    assert (tmp_path / "summary.json").exists() and (tmp_path / "best_so_far.png").exists()
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--driver", "inprocess", "--budget", "5",
                           "--results", str(tmp_path)], capsys)
    assert code == 0 and "winner:" in out and "ledger:" in out and "resumed 5" in out


@pytest.mark.parametrize("argv, message", [
    (["tune", "no/such/experiment.yaml"], "does not exist"),
    (["tune", "no-such-bundled-experiment"], "unknown experiment"),
    (["compare", "tiny-moe-h100-8", "--searchers", "random", "nonsense"], "unknown searcher 'nonsense'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, out, err = _cli(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert all(line.startswith("error: ") for line in err.strip().splitlines())


def test_bad_budget_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        _cli(["tune", "tiny-moe-h100-8", "--budget", "0"], capsys)
    assert e.value.code == 2
    assert "--budget must be a positive integer" in capsys.readouterr().err


def test_compare_inprocess_json_has_the_issue_4_shape(tmp_path, capsys):
    code, out, err = _cli(["compare", "tiny-moe-h100-8", "--driver", "inprocess", "--budget", "5", "--seeds", "2",
                           "--searchers", "random", "grid", "--format", "json", "--plot", str(tmp_path / "c.png")], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert set(s["optimum"]) >= {"tokens_per_s_per_gpu", "config"} and s["space_size"] > 0
    for name in ("random", "grid"):
        assert set(s["searchers"][name]) >= {"median_best", "median_regret", "regrets", "median_trials_to_2pct",
                                             "prefilter_rejections", "proposer"}
        assert len(s["searchers"][name]["regrets"]) == 2
    assert (tmp_path / "c.png").exists()


@pytest.mark.ray
def test_compare_on_ray_equals_compare_in_process(cluster, small, tmp_path, monkeypatch):
    from raytune_primus.jobs import compare_experiment
    from searchers import driver
    from tests.raytune_primus.conftest import SmallCapEvaluator

    # driver.exhaustive_optimum memoises per (space, oracle mode): other tests' synthetic oracles with other
    # memory caps share the mode, so start from an empty memo
    monkeypatch.setattr(driver, "_OPTIMA", {})

    kw = {"budget": 6, "seeds": 2, "searchers": ["seed_llm", "random"], "evaluator": SmallCapEvaluator()}
    ref = compare_experiment(small, tmp_path / "inproc", driver="inprocess", **kw)
    got = compare_experiment(small, tmp_path / "ray", driver="ray", address=cluster.address, **kw)
    def strip(summary):
        out = {k: v for k, v in summary.items() if k not in TIMING_KEYS}
        out["searchers"] = {n: {k: x for k, x in v.items() if k != "wall_s"} for n, v in out["searchers"].items()}
        return out

    assert strip(got) == strip(ref)
    assert got["ray"]["nodes"] >= 3
    from searchers.ledger import read_rows
    key = lambda r: (r["run_id"], r["row"])  # noqa: E731
    cols = ("run_id", "row", "trial_index", "status", "config_key", "tokens_per_s_per_gpu")
    a = sorted(({c: r[c] for c in cols} for r in read_rows(tmp_path / "inproc" / "ledger.parquet")), key=key)
    b = sorted(({c: r[c] for c in cols} for r in read_rows(tmp_path / "ray" / "ledger.parquet")), key=key)
    assert a == b
    # again into the same directory: every run resumes from the ledger, nothing is added
    again = compare_experiment(small, tmp_path / "ray", driver="ray", address=cluster.address, **kw)
    assert strip(again) == strip(ref)
    assert len(read_rows(tmp_path / "ray" / "ledger.parquet")) == len(b)


@pytest.mark.ray
def test_tune_on_ray_through_the_cli(cluster, tmp_path, capsys):
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--budget", "4", "--results", str(tmp_path),
                           "--address", cluster.address], capsys)
    assert code == 0, err
    assert "[4/4]" in err and "winner:" in out and "driver ray" in out
    assert "memory per GPU" in out, "the winner's projection table"
    # the same command again resumes the finished run: nothing is scored twice
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--budget", "4", "--results", str(tmp_path),
                           "--address", cluster.address, "--format", "json"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert s["tune"]["restored"] and s["resumed"] == 4 and s["tune_trials"] == 4 and s["trials_run"] == 4
    # another search into the same directory is refused with a one-line reason
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--budget", "5", "--results", str(tmp_path),
                           "--address", cluster.address], capsys)
    assert code == 2 and "budget=4" in err and "--fresh" in err


def test_search_commands_are_not_dropped_when_their_module_fails_to_import(monkeypatch):
    import sys

    import pytest

    from raytune_primus import cli
    monkeypatch.setitem(sys.modules, "raytune_primus.search_cli", None)  # any import of it raises ImportError
    with pytest.raises(ImportError):
        cli.build_parser()


def test_a_winner_projection_error_is_shown_not_dropped(monkeypatch):
    import oracle.projector
    from oracle.errors import InvalidConfigError
    from raytune_primus.jobs import _projection_table
    from searchers.experiment import load_experiment

    def refuse(run, mode="simulate", **kwargs):
        raise InvalidConfigError("num_layers=4 is not divisible by pp=3")
    monkeypatch.setattr(oracle.projector, "project", refuse)
    exp = load_experiment("tiny-moe-h100-8")
    text = _projection_table(exp, {"winner": {"config": {"tp": 1}}})
    assert text is not None and "InvalidConfigError: num_layers=4 is not divisible by pp=3" in text


def test_tune_leaves_the_cluster_to_ray_address_unless_told(monkeypatch, capsys):
    """`raytune-primus tune` used to force an embedded Ray, so inside `ray job submit` it ignored the job's
    cluster; now no --address means init_ray(None): RAY_ADDRESS, else embedded."""
    from raytune_primus import jobs
    from raytune_primus.cli import main

    seen = {}

    def fake(exp, results, **kw):
        seen.update(kw)
        return {"ok": True, "winner": None, "experiment": exp.name, "searcher": "random", "seed": 0, "budget": 1,
                "driver": kw["driver"], "trials_run": 0, "rejected": 0, "failed": 0, "illegal": 0, "ledger": "l"}
    monkeypatch.setattr(jobs, "tune_experiment", fake)
    assert main(["tune", "tiny-moe-h100-8", "--quiet"]) == 0
    assert seen["address"] is None and seen["driver"] == "ray" and seen["max_failures"] == 2
    assert main(["tune", "tiny-moe-h100-8", "--quiet", "--address", "auto", "--max-failures", "0"]) == 0
    assert seen["address"] == "auto" and seen["max_failures"] == 0


def test_the_tune_summary_prints_the_winners_layout_and_what_is_not_at_its_default():
    """The winner line: the layout keys whatever their values, every other key only where it is not at its default
    (counted, not listed: summary.json has them all)."""
    from oracle.config import training_defaults
    from raytune_primus.jobs import WINNER_KEYS, format_tune_summary
    t = {**training_defaults(), "seq_len": 4096, "gbs": 128, "mbs": 8, "fsdp": True,
         "use_distributed_optimizer": False}
    s = {"experiment": "x", "searcher": "random", "seed": 0, "budget": 1, "driver": "inprocess", "trials_run": 1,
         "rejected": 0, "failed": 0, "illegal": 0, "ledger": "l", "winner": {"tokens_per_s_per_gpu": 1.0, "config": t}}
    line = format_tune_summary(s).splitlines()[3]
    shown = dict(kv.split("=", 1) for kv in line.split("  (")[0].split())
    assert list(shown) == [k for k in t if k in WINNER_KEYS or k in ("fsdp", "use_distributed_optimizer")]
    assert shown["fsdp"] == "True" and shown["use_distributed_optimizer"] == "False" and shown["mbs"] == "8"
    assert f"the other {sum(v is not None for v in t.values()) - len(shown)} training keys at their defaults" in line


def test_seed_flags_take_what_every_searcher_takes(capsys):
    """--seed and --seed-list: integers in 0..2**32-1, refused otherwise with the range (tpe raised from numpy)."""
    import argparse

    from raytune_primus.search_args import add_compare_arguments, add_tune_arguments
    p = argparse.ArgumentParser()
    add_tune_arguments(p)
    assert p.parse_args(["--seed", str(2**32 - 1)]).seed == 2**32 - 1
    for bad in ("-1", str(2**32), "x"):
        with pytest.raises(SystemExit):
            p.parse_args(["--seed", bad])
        assert "--seed must be" in capsys.readouterr().err
    c = argparse.ArgumentParser()
    add_compare_arguments(c)
    assert c.parse_args(["--seed-list", "0", "7"]).seed_list == [0, 7]
    with pytest.raises(SystemExit):
        c.parse_args(["--seed-list", "1", str(2**32)])
    assert "--seed-list must be in 0..4294967295" in capsys.readouterr().err


def test_a_results_path_that_is_a_file_is_a_clear_error(tmp_path):
    """tune/compare --results onto a file: an error naming it (was the OS's 'File exists'); a missing folder is made."""
    from oracle.errors import InvalidConfigError
    from raytune_primus.jobs import make_results_folder
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(InvalidConfigError, match=r"results folder '.*afile' is a file"):
        make_results_folder(f)
    made = make_results_folder(tmp_path / "a" / "b")
    assert made.is_dir()
