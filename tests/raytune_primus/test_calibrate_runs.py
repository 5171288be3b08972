"""``raytune-primus calibrate-runs``: the paper's Appendix E pairs, the user's own configs, and a run's report."""
from __future__ import annotations

import json

import pytest
import yaml

from oracle.config import RunConfig
from oracle.projector import project
from raytune_primus.cli import main
from tests.conftest import ROOT

RUNS = ROOT / "tests" / "fixtures" / "runs"
TINY = {"model": "tiny-moe", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
        "training": {"seq_len": 2048, "gbs": 64, "mbs": 1, "tp": 1, "pp": 2, "ep": 2, "recompute": "full"}}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mixtral_appendix_e_table(capsys):
    code, out, err = run_cli(capsys, "calibrate-runs", str(RUNS / "mixtral-appendix-e.csv"))
    assert code == 0, err
    assert "k = projected/measured = 1.128" in out and "cv 2.4%" in out and "median 1.132" in out
    assert "Spearman 1.000  Kendall 1.000  concordant 21/21" in out and "discordant (measured gap) none" in out
    assert "> 9% apart: 10/10" in out and "top-1 regret 0.0%  top-3 regret 0.0%" in out
    assert "r14_b1" in out  # the largest |k - median| (paper Table 21: 0.048)


def test_gpt_oss_json_lists_the_three_near_tie_reversals(capsys):
    code, out, _ = run_cli(capsys, "calibrate-runs", str(RUNS / "gpt-oss-appendix-e.csv"), "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["fit"]["k"] == pytest.approx(1.121, abs=6e-4) and d["fit"]["cv"] == pytest.approx(0.054, abs=6e-4)
    ra = d["rank_agreement"]
    assert {frozenset((f["a"], f["b"])) for f in ra["discordant"]} == {
        frozenset(("mbs16", "baseline")), frozenset(("mbs16", "mbs2")), frozenset(("baseline", "mbs2"))}
    for r in d["runs"]:  # the band of k covers every run it was fitted to
        assert r["low_tokens_per_s_per_gpu"] < r["run"]["measured_tokens_per_s_per_gpu"] < r["high_tokens_per_s_per_gpu"]


def _configs(tmp_path, mbs_values):
    paths = []
    for mbs in mbs_values:
        data = json.loads(json.dumps(TINY))
        data["training"]["mbs"] = mbs
        p = tmp_path / f"tiny-mbs{mbs}.yaml"
        p.write_text(yaml.safe_dump(data))
        paths.append(p)
    return paths


def test_measured_flags_project_the_users_configs(tmp_path, capsys):
    paths = _configs(tmp_path, [1, 2, 4])
    projected = [project(RunConfig.load(p)).tokens_per_s_per_gpu for p in paths]
    # pretend the cluster ran 10% slower than projected, uniformly: k = 1.1, no spread
    flags = [a for p, v in zip(paths, projected) for a in ("--measured", f"{p}={v / 1.1:.3f}")]
    code, out, err = run_cli(capsys, "calibrate-runs", *flags, "--project", str(paths[0]), "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    assert d["fit"]["k"] == pytest.approx(1.1, rel=1e-4) and d["fit"]["cv"] < 1e-4
    assert [r["run"]["tag"] for r in d["runs"]] == ["tiny-mbs1", "tiny-mbs2", "tiny-mbs4"]
    c = d["calibrated"][0]
    assert c["tokens_per_s_per_gpu"] == pytest.approx(projected[0] / 1.1, rel=1e-4)


def test_csv_with_a_base_config_and_override_columns(tmp_path, capsys):
    base = _configs(tmp_path, [1])[0]
    proj = {m: project(RunConfig.load(base, [f"training.mbs={m}"])).tokens_per_s_per_gpu for m in (1, 2)}
    csv = tmp_path / "runs.csv"
    csv.write_text("tag,mbs,measured_tokens_per_s_per_gpu\n"
                   f"a,1,{proj[1] / 1.2:.2f}\n"
                   f"b,2,{proj[2] / 1.0:.2f}\n")
    code, out, err = run_cli(capsys, "calibrate-runs", str(csv), "--config", str(base), "--format", "json")
    assert code == 0, err
    ks = {r["run"]["tag"]: r["k"] for r in json.loads(out)["runs"]}
    assert ks["a"] == pytest.approx(1.2, rel=1e-3) and ks["b"] == pytest.approx(1.0, rel=1e-3)


def test_results_dir_gets_calibrated_candidates_and_a_report_section(tmp_path, capsys):
    results = tmp_path / "run"
    assert main(["tune", str(ROOT / "experiments" / "tiny-moe-h100-8.yaml"), "--driver", "inprocess", "--budget", "6",
                 "--results", str(results), "--quiet", "--format", "json"]) == 0
    capsys.readouterr()
    paths = _configs(tmp_path, [1, 2])
    flags = [a for p in paths for a in ("--measured", f"{p}={project(RunConfig.load(p)).tokens_per_s_per_gpu / 1.05}")]
    code, out, err = run_cli(capsys, "calibrate-runs", *flags, "--results", str(results))
    assert code == 0, err
    cal = json.loads((results / "calibration.json").read_text())
    assert cal["fit"]["k"] == pytest.approx(1.05, rel=1e-4) and 1 <= len(cal["calibrated"]) <= 10
    html = (results / "report.html").read_text()
    assert "Calibration against measured runs" in html and (results / "calibration.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["calibrate-runs"], "needs measured runs"),
    (["calibrate-runs", "--measured", "no-equals-sign"], "expected CONFIG=TOKENS"),
    (["calibrate-runs", "--measured", "x.yaml=fast"], "is not a number"),
    (["calibrate-runs", str(RUNS / "README.md")], "needs a measured_tokens_per_s_per_gpu"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1
