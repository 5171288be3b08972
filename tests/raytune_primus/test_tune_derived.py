"""``raytune-primus tune --model M --hardware H --num-gpus N --seq-len S --gbs G`` (an experiment derived from
the model and the cluster), ``experiments init`` (the same experiment as a file), the numerics note in the
summary and the report, and one-line errors for empty or partial inline hardware and model mappings."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

DERIVE = ["--model", "llama3.1-70b", "--hardware", "h100-sxm", "--num-gpus", "64", "--seq-len", "8192",
          "--gbs", "128"]
BUDGET = ["--budget", "15"]  # the winner's equality does not need the default 30 trials; half keeps this test short


def _cli(argv, capsys):
    from raytune_primus.cli import main
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_derived_tune_equals_the_search_from_the_file_init_writes(tmp_path, capsys):
    code, out, err = _cli(["tune", *DERIVE, "--driver", "inprocess", *BUDGET, "--results", str(tmp_path / "a"),
                           "--quiet"], capsys)
    assert code == 0, err
    assert "winner:" in out and "numerics held as given (precision bf16)" in out
    for f in ("ledger.parquet", "summary.json", "report.html", "experiment.yaml"):
        assert (tmp_path / "a" / f).exists(), f
    code, out, err = _cli(["experiments", "init", *DERIVE, "-o", str(tmp_path / "exp.yaml")], capsys)
    assert code == 0 and "wrote" in out, err
    assert (tmp_path / "exp.yaml").read_text() == (tmp_path / "a" / "experiment.yaml").read_text()
    code, out, err = _cli(["tune", str(tmp_path / "exp.yaml"), "--driver", "inprocess", *BUDGET, "--results",
                           str(tmp_path / "b"), "--quiet"], capsys)
    assert code == 0, err
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("a", "b"))
    assert a["winner"]["config"] == b["winner"]["config"]
    assert a["winner"]["tokens_per_s_per_gpu"] == b["winner"]["tokens_per_s_per_gpu"]
    assert a["winner"]["tokens_per_s_per_gpu"] >= a["best_so_far"][0]  # no worse than the derived baseline
    assert a["experiment"] == b["experiment"] == "llama3.1-70b-h100-sxm-64gpu-seq8192-gbs128-bf16"
    assert a["numerics"]["open"] == [] and a["numerics"]["changed"] == {}
    assert "numerics held as given" in (tmp_path / "a" / "report.html").read_text()


def test_init_prints_the_yaml_and_it_names_the_allowed_numerics(capsys):
    code, out, err = _cli(["experiments", "init", "--model", "tiny-moe", "--hardware", "h100-sxm", "--num-gpus", "8",
                           "--seq-len", "2048", "--gbs", "64", "--allow", "precision"], capsys)
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["space"]["allow"] == ["precision"] and spec["baseline"]["precision"] == "bf16"
    assert "opened (space.allow): precision" in out


def test_the_summary_and_report_say_when_the_winner_changes_the_numerics(tmp_path, capsys):
    # Llama 3.1 70B on 64 H100 with the precision opened: FP8 wins (the GEMMs dominate)
    code, out, err = _cli(["tune", *DERIVE, "--allow", "precision", "--driver", "inprocess", "--results",
                           str(tmp_path), "--quiet", "--format", "json"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert "precision" in s["numerics"]["open"]
    assert s["numerics"]["changed"].get("precision") == "fp8"
    html = (tmp_path / "report.html").read_text()
    assert "the winner changes precision bf16 -&gt; fp8" in html
    # tiny-moe lists precision in its space (opened explicitly): the summary says it was open, whatever won
    code, out, err = _cli(["tune", "tiny-moe-h100-8", "--driver", "inprocess", "--results",
                           str(tmp_path / "tiny"), "--quiet", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["numerics"]["open"] == ["precision"]


@pytest.mark.parametrize("argv, message", [
    (["tune"], "tune needs an experiment (a bundled name or a YAML path), or --model M --hardware H"),
    (["tune", "--model", "llama3.1-70b", "--hardware", "h100-sxm"], "missing: --num-gpus, --seq-len, --gbs"),
    (["tune", "tiny-moe-h100-8", "--model", "llama3.1-70b"], "not both"),
    (["tune", "tiny-moe-h100-8", "--precision", "fp8"], "--precision applies only to a derived experiment"),
    (["tune", "tiny-moe-h100-8", "--allow", "precison"], "unknown group 'precison'"),
    (["compare", "--suite", "--model", "llama3.1-70b"], "do not apply with --suite"),
    (["experiments", "init", "--model", "llama3.1-70b"], "missing: --hardware, --num-gpus, --seq-len, --gbs"),
    (["experiments", "list", "--model", "llama3.1-70b"], "those are for init"),
    (["tune", *DERIVE, "--set", "pp=3", "--driver", "inprocess"], "no legal configuration"),  # 3 does not divide 64
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, out, err = _cli(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


# ------------------------------------------------------------------------ one-line inline-mapping errors
H100 = str(Path(__file__).resolve().parents[2] / "hardware" / "h100-sxm.yaml")


def _partial_h100() -> dict:
    data = yaml.safe_load(Path(H100).read_text())
    del data["memory"]["hbm_capacity_gib"], data["efficiency"]["hbm"], data["network"]["scale_out"]
    return data


CASES = {
    "empty hardware": ({"hardware": {}}, None, "config.cluster.hardware is an empty mapping: a profile needs sections "
                                               "compute"),
    "partial hardware": ({"hardware": "PARTIAL"}, None,
                         "is incomplete, missing memory.hbm_capacity_gib, network.scale_out, efficiency.hbm: "),
    "vendor only": ({"hardware": {"name": "x", "vendor": "nvidia"}}, None,
                    "is incomplete, missing compute, memory, network, efficiency: "),
    "empty model": (None, {}, "model card 'inline' is an empty mapping: a card needs num_layers, hidden_size"),
    "partial model": (None, {"name": "m", "num_layers": 4, "hidden_size": 512},
                      "model card 'm' is incomplete, missing num_attention_heads, vocab_size: a card needs"),
}


def _mapping(case: str):
    cluster, model, _ = CASES[case]
    cl = {"hardware": "h100-sxm", "num_gpus": 8, **(cluster or {})}
    if cl["hardware"] == "PARTIAL":
        cl["hardware"] = _partial_h100()
    return (model if model is not None else "tiny-moe"), cl


@pytest.mark.parametrize("case", CASES)
def test_an_empty_or_partial_inline_mapping_is_one_line_in_a_config(case, tmp_path, capsys):
    model, cluster = _mapping(case)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": model, "cluster": cluster, "training": {"seq_len": 2048, "gbs": 64}}))
    code, out, err = _cli(["project", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and CASES[case][2] in lines[0], err


@pytest.mark.parametrize("case", CASES)
def test_an_empty_or_partial_inline_mapping_is_one_line_in_an_experiment(case, tmp_path, capsys):
    model, cluster = _mapping(case)
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"model": model, "cluster": cluster, "baseline": {"seq_len": 2048, "gbs": 64}}))
    for argv in (["experiments", "show", str(path)], ["tune", str(path), "--driver", "inprocess"]):
        code, out, err = _cli(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and CASES[case][2].replace("config.", "e.") in lines[0], err


def test_a_partial_profile_file_is_one_line_too(tmp_path, capsys):
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(_partial_h100()))
    code, out, err = _cli(["tune", "--model", "tiny-moe", "--hardware", str(path), "--num-gpus", "8", "--seq-len",
                           "2048", "--gbs", "64"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "is incomplete, missing memory.hbm_capacity_gib" in lines[0], err


def test_allow_software_searches_the_same_space_from_the_command_line_and_from_the_file(tmp_path, capsys):
    derive = ["--model", "tiny-moe", "--hardware", "h100-sxm", "--num-gpus", "8", "--seq-len", "2048", "--gbs", "64",
              "--allow", "software"]
    code, out, err = _cli(["tune", *derive, "--driver", "inprocess", *BUDGET, "--results", str(tmp_path / "a"),
                           "--quiet", "--format", "json"], capsys)
    assert code == 0, err
    a = json.loads(out)
    assert "cuda_graph_impl" in a["software"]["open"] and a["software"]["more"] == []
    code, out, err = _cli(["experiments", "init", *derive, "-o", str(tmp_path / "exp.yaml")], capsys)
    assert code == 0, err
    text = (tmp_path / "exp.yaml").read_text()
    assert "searched (space.allow: software)" in text and yaml.safe_load(text)["space"]["allow"] == ["software"]
    code, out, err = _cli(["tune", str(tmp_path / "exp.yaml"), "--driver", "inprocess", *BUDGET, "--results",
                           str(tmp_path / "b"), "--quiet", "--format", "json"], capsys)
    assert code == 0, err
    b = json.loads(out)
    assert a["winner"]["config"] == b["winner"]["config"]
