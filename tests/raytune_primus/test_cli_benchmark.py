"""`project --mode benchmark|both` on the CPU with a tiny card (real torch layers, a temporary cache)."""
import json

import pytest

from raytune_primus.cli import main

pytest.importorskip("torch")

CONFIG = """model: tiny-moe
cluster: {hardware: h100-sxm, num_gpus: 8}
training: {seq_len: 64, gbs: 8, mbs: 1, tp: 1, pp: 2, ep: 2, pp_schedule: 1f1b}
"""


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_benchmark_and_both_modes(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    flags = ["--cache-dir", str(tmp_path / "cache"), "--repeats", "1"]
    code, out, err = _cli(capsys, "project", str(cfg), "--mode", "benchmark", "--format", "json", *flags)
    assert code == 0, err
    d = json.loads(out)
    assert d["mode"] == "benchmark" and "measured" in json.dumps(d["breakdown_s"])
    assert d["details"]["benchmark"]["plan"]["steps"][0].startswith("PP 2 -> 1")
    assert list((tmp_path / "cache").glob("*.json"))
    code, out, err = _cli(capsys, "project", str(cfg), "--mode", "both", *flags)
    assert code == 0, err
    assert "== simulate" in out and "== benchmark" in out and "experts_up" in out and "bench/sim" in out
    code, out, err = _cli(capsys, "project", str(cfg), "--mode", "both", "--format", "json", *flags)
    d = json.loads(out)
    assert d["simulate"]["mode"] == "simulate" and d["benchmark"]["mode"] == "benchmark"
    moe = next(r for r in d["layers"] if r["layer"] == "moe")
    assert any(o["op"] == "experts_up" and "simulate" in o for o in moe["ops"])


def test_bad_benchmark_gpus_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["project", "x.yaml", "--mode", "benchmark", "--benchmark-gpus", "0"])
    assert e.value.code == 2


def test_hardware_calibrate_writes_a_profile_that_loads(capsys, tmp_path):
    from oracle.hardware import load_hardware
    out = tmp_path / "here.yaml"
    code, text, err = _cli(capsys, "hardware", "calibrate", "here", "--threads", "1", "-o", str(out))
    assert code == 0, err
    hw = load_hardware(str(out))
    assert hw.name == "here" and hw.num_compute_units == 1
    assert 0 < hw.efficiency.gemm_bf16 <= 1 and 0 < hw.efficiency.hbm <= 1
    assert "measured by `raytune-primus hardware calibrate`" in out.read_text()
