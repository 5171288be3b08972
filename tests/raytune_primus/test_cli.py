"""The command line as a new user meets it: happy paths and bad input (one-line errors, exit 2)."""
import json
import subprocess
import sys

import pytest

from raytune_primus.cli import main
from tests.conftest import ROOT

CONFIG = ROOT / "tests" / "fixtures" / "configs" / "llama70b-h100.yaml"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_project_table(capsys):
    code, out, err = run_cli(capsys, "project", str(CONFIG))
    assert code == 0, err
    assert "memory per GPU" in out and "tokens/s/GPU" in out and "memory tree" in out


def test_project_json_with_override(capsys):
    code, out, _ = run_cli(capsys, "project", str(CONFIG), "--set", "training.pp=8", "--set", "vpp=5",
                           "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["config"]["training"]["pp"] == 8 and d["mode"] == "simulate"
    assert d["tokens_per_s_per_gpu"] > 0 and "fits" in d["memory"]


def test_a_config_that_does_not_fit_gets_the_one_change_neighbours_that_do(capsys):
    # llama70b-h100.yaml projects 76.4 GiB against a 70.2 GiB cap
    code, out, _ = run_cli(capsys, "project", str(CONFIG), "--format", "json")
    d = json.loads(out)
    assert code == 0 and not d["memory"]["fits"] and d["fit_hints"]
    speeds = [h["tokens_per_s_per_gpu"] for h in d["fit_hints"]]
    assert speeds == sorted(speeds, reverse=True) and len(speeds) <= 5
    for h in d["fit_hints"]:  # each change, applied, fits and projects what the hint says
        sets = [x for k, v in h["change"].items() for x in ("--set", f"training.{k}={str(v).lower()}")]
        code, out, _ = run_cli(capsys, "project", str(CONFIG), *sets, "--format", "json")
        again = json.loads(out)
        assert code == 0 and again["memory"]["fits"] and "fit_hints" not in again
        assert again["tokens_per_s_per_gpu"] == pytest.approx(h["tokens_per_s_per_gpu"], rel=1e-9)
        assert len(h["change"]) == 1 and "precision" not in h["change"]  # one change, never the numerics
    code, out, _ = run_cli(capsys, "project", str(CONFIG))
    assert "legal one-change neighbours fit" in out and "raytune-primus tune --model llama3.1-70b" in out
    code, out, _ = run_cli(capsys, "project", str(CONFIG), "--no-hints", "--format", "json")
    assert "fit_hints" not in json.loads(out)


def test_unfused_attention_that_does_not_fit_is_told_the_fused_kernel_does(capsys):
    """The score matrices of attention_backend=unfused are what overflows: the fused kernel is the fastest fix, and
    applied with --set it fits and projects what the hint said."""
    base = ["project", "--model", "llama3.1-8b", "--hardware", "h100-sxm", "--num-gpus", "8", "--seq-len", "4096",
            "--gbs", "64", "--set", "training.recompute=none"]
    code, out, _ = run_cli(capsys, *base, "--set", "training.attention_backend=unfused", "--format", "json")
    d = json.loads(out)
    assert code == 0 and not d["memory"]["fits"]
    first = d["fit_hints"][0]
    assert first["change"] == {"attention_backend": "auto"}
    code, out, _ = run_cli(capsys, *base, "--format", "json")
    again = json.loads(out)
    assert again["memory"]["fits"] and again["tokens_per_s_per_gpu"] == pytest.approx(first["tokens_per_s_per_gpu"],
                                                                                       rel=1e-9)
    assert d["tokens_per_s_per_gpu"] < again["tokens_per_s_per_gpu"]


def test_compare_schedules_and_gantt(capsys, tmp_path):
    png = tmp_path / "g.png"
    code, out, err = run_cli(capsys, "project", str(CONFIG), "--compare-schedules", "--gantt", str(png))
    assert code == 0, err
    assert "zero_bubble" in out and "vs 1F1B" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
            ("1f1b", "zbv", "v_min")}
    assert "approximate construction" in rows["v_min"]  # our V-Min stand-in says so
    assert "approximate" not in rows["1f1b"] and "approximate" not in rows["zbv"]
    assert png.exists() and png.stat().st_size > 1000


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BAD = [
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\ntraining: {seq_len: 8192, gbs: 128, tpp: 8}\n",
     "unknown key 'tpp' (did you mean 'tp'?)"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\ntraining: {seq_len: 8192, gbs: 128, tp: 3}\n",
     "tp*pp*cp = 3*1*1 = 3 does not divide 64 GPUs"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\ntraining: [1, 2]\n",
     "config.training must be a mapping"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\ntraining: {seq_len: 8192, gbs: 128\n",
     "is not valid YAML/JSON at line"),
    # a loose spelling of a bundled card resolves (tests/oracle/test_registry_lookup.py); a name no card has does not
    ("model: llama-9-70b\ncluster: {hardware: h100, num_gpus: 64}\ntraining: {seq_len: 8192, gbs: 128}\n",
     "unknown model 'llama-9-70b'; valid:"),
    ("- a\n- b\n", "must hold a mapping at the top level"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\n", "missing required section 'training'"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_input_is_one_line_per_problem_and_exit_2(capsys, tmp_path, text, needle):
    code, out, err = run_cli(capsys, "project", write(tmp_path, text))
    assert code == 2
    assert needle in err
    assert "Traceback" not in err and out == ""
    assert all(line.startswith("error: ") for line in err.strip().splitlines())


def test_missing_file_and_bad_override(capsys, tmp_path):
    code, _, err = run_cli(capsys, "project", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(capsys, "project", str(CONFIG), "--set", "training.tp")
    assert code == 2 and "expected KEY=VALUE" in err
    code, _, err = run_cli(capsys, "project", str(CONFIG), "--mode", "benchmark", "--set", "training.cp=2",
                           "--benchmark-gpus", "1")
    assert code == 2 and "CP=2 is never reduced" in err and "--benchmark-gpus >= 2" in err


def test_no_traceback_from_a_real_process(tmp_path):
    bad = write(tmp_path, BAD[1][0])
    proc = subprocess.run([sys.executable, "-m", "raytune_primus", "project", bad], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "does not divide" in proc.stderr


def test_hardware_and_models_listing(capsys):
    code, out, _ = run_cli(capsys, "hardware", "list")
    assert code == 0 and "mi355x" in out and "gb200-nvl72" in out
    code, out, _ = run_cli(capsys, "hardware", "show", "h100-sxm")
    assert code == 0 and json.loads(out)["efficiency"]["gemm_bf16"]["source"]
    code, _, err = run_cli(capsys, "hardware", "show", "h1000")
    assert code == 2 and "unknown hardware profile 'h1000'" in err
    code, out, _ = run_cli(capsys, "models", "list")
    assert code == 0 and "deepseek-v3" in out
    code, out, _ = run_cli(capsys, "models", "show", "mixtral-8x22b")
    assert code == 0 and json.loads(out)["num_experts"] == 8


def test_models_import(capsys, tmp_path):
    src = ROOT / "tests" / "fixtures" / "hf" / "llama-3.1-8b" / "config.json"
    if not src.exists():
        src = next((ROOT / "tests" / "fixtures" / "hf").rglob("*.json"))
    out_yaml = tmp_path / "card.yaml"
    code, out, err = run_cli(capsys, "models", "import", str(src), "-o", str(out_yaml))
    assert code == 0, err
    assert out_yaml.exists()
    cfg = write(tmp_path, f"model: {out_yaml}\ncluster: {{hardware: h100-sxm, num_gpus: 8}}\n"
                          f"training: {{seq_len: 4096, gbs: 64}}\n", "run.yaml")
    code, out, err = run_cli(capsys, "project", cfg, "--format", "json")
    assert code == 0, err


def test_validate_json(capsys, tmp_path):
    csv = tmp_path / "v.csv"
    csv.write_text("id,group,model,hardware,num_gpus,seq_len,gbs,tp,mbs,measured_tokens_per_s_per_gpu\n"
                   "a,g,llama2-7b,h100-sxm,8,4096,128,1,,15000\nb,g,llama2-7b,h100-sxm,8,4096,128,2,,14000\n"
                   "c,g,llama2-7b,h100-sxm,8,4096,128,8,,12000\nd,g,llama2-7b,h100-sxm,8,,128,1,,1\n"
                   "e,g,llama2-7b,h100-sxm,8,4096,128,2,2,14500\n")
    code, out, err = run_cli(capsys, "validate", str(csv), "--format", "json", "--plot", str(tmp_path / "p.png"))
    assert code == 0, err
    d = json.loads(out)
    assert {r["id"] for r in d["rows"]} == {"a", "b", "c", "d", "e"}
    row = d["rows"][0]
    for k in ("id", "group", "quantity", "measured", "projected", "error", "skipped", "fits", "projected_peak_gib",
              "measured_peak_mem_gib", "assumed"):
        assert k in row
    assert d["groups"]["g"]["spearman"] is not None and "summary" in d
    # e differs from b only in mbs: one batch contrast, larger micro-batch first
    assert [(c["a"], c["b"]) for c in d["contrasts"]] == [("e", "b")]
    assert d["contrasts"][0]["measured"] == pytest.approx(14500 / 14000 - 1)
    assert (tmp_path / "p.png").exists()


@pytest.mark.parametrize("mode,says", [("auto", None), ("off", "the Python loop"), ("numba", "numba")])
def test_version_says_which_pipeline_replay_runs(capsys, monkeypatch, mode, says):
    from oracle.pipeline import _jit
    monkeypatch.setenv("RAYTUNE_PRIMUS_JIT", mode)
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("raytune-primus ") and f"[RAYTUNE_PRIMUS_JIT={mode}]" in out
    built = _jit.extension() is not None
    assert ("the C extension is not built here" in out) is not built
    if says:
        assert f"pipeline replay: {says}" in out
    else:
        assert ("pipeline replay: the C extension" in out) is built


def test_version_without_the_extension_names_the_fallback(capsys, monkeypatch):
    from oracle.pipeline import _jit
    monkeypatch.setattr(_jit, "_NATIVE", {"ext": None})
    monkeypatch.setenv("RAYTUNE_PRIMUS_JIT", "auto")
    with pytest.raises(SystemExit):
        main(["--version"])
    out = capsys.readouterr().out
    assert "the C extension is not built here" in out and "pipeline replay: the C extension" not in out


def test_version_with_a_bad_jit_mode_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setenv("RAYTUNE_PRIMUS_JIT", "fast")
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip() == "error: RAYTUNE_PRIMUS_JIT='fast' is not one of auto, on, numba, off"


def test_validate_of_ones_own_runs_without_a_quality_column(capsys, tmp_path):
    """A CSV of one's own runs (the required columns, no quality): every row projected and scored; no empty
    per-model table, a line saying why there is none."""
    csv = tmp_path / "mine.csv"
    csv.write_text("id,model,hardware,num_gpus,seq_len,gbs,tp,pp,measured_tokens_per_s_per_gpu\n"
                   "r1,llama3.1-8b,h100-sxm,8,8192,128,1,1,11000\nr2,llama3.1-70b,h100-sxm,64,8192,128,4,4,1500\n")
    code, out, err = run_cli(capsys, "validate", str(csv))
    assert code == 0, err
    assert "2/2 rows projected" in out and "per model (quality A rows" not in out
    assert "per model: no row is rated quality A" in out


def test_count_flags_refuse_zero_and_negative_values(capsys):
    """project --num-gpus 0 was reported as a missing flag; validate --jobs -1 ran on one process: both are now
    argparse errors naming the flag and the range."""
    for argv, needle in ((["project", "--model", "llama3.1-8b", "--hardware", "h100", "--num-gpus", "0",
                           "--seq-len", "4096", "--gbs", "64"], "--num-gpus must be a positive integer, got 0"),
                         (["validate", "x.csv", "--jobs", "-1"], "--jobs must be a non-negative integer, got -1")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_file_that_cannot_be_written_is_one_error_line(capsys, tmp_path):
    """An output path the command cannot write (a folder where a file should go) is an error naming the path and
    the reason, exit 2, no traceback; a CSV without groups plots without a legend warning."""
    import warnings

    csv = tmp_path / "mine.csv"
    csv.write_text("id,model,hardware,num_gpus,seq_len,gbs,tp,pp,measured_tokens_per_s_per_gpu\n"
                   "r1,llama3.1-8b,h100-sxm,8,8192,128,1,1,11000\n")
    blocked = tmp_path / "blocked.png"
    blocked.mkdir()  # a folder where the figure should go
    code, out, err = run_cli(capsys, "validate", str(csv), "--plot", str(blocked))
    assert code == 2 and "Traceback" not in err and str(blocked) in err
    assert len(err.strip().splitlines()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, out, err = run_cli(capsys, "validate", str(csv), "--plot", str(tmp_path / "ok.png"))
    assert code == 0 and (tmp_path / "ok.png").exists(), err
