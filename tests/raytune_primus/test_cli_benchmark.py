"""`project --mode benchmark|both` on the CPU with a tiny card (real torch layers, a temporary cache)."""
import json

import pytest

from raytune_primus.cli import main

pytest.importorskip("torch")

CONFIG = """model: tiny-moe
cluster: {hardware: h100-sxm, num_gpus: 8}
training: {seq_len: 64, gbs: 8, mbs: 1, tp: 1, pp: 2, ep: 2, pp_schedule: 1f1b}
"""


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """Behaviour, not this shared machine's load: the Bencher's load check sees nothing."""
    from oracle.benchmark.load import LoadMonitor
    monkeypatch.setattr(LoadMonitor, "since", lambda self, mark: None)


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
    assert "layers timed in" in out  # the dtype the device ran, and why
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
    code, text, err = _cli(capsys, "hardware", "calibrate", "here", "--threads", "1", "-o", str(out),
                           "--allow-busy", "--wait", "0")  # behaviour, not this shared machine's load
    assert code == 0, err
    assert "layers timed in" in err and " GEMM " in text
    hw = load_hardware(str(out))
    assert hw.name == "here" and hw.num_compute_units == 1
    assert 0 < hw.efficiency.gemm_bf16 <= 1 and 0 < hw.efficiency.hbm <= 1
    assert "measured by `raytune-primus hardware calibrate`" in out.read_text()


def _busy(monkeypatch):
    from oracle.benchmark.load import LoadMonitor, LoadSeen
    monkeypatch.setattr(LoadMonitor, "idle", lambda self, window_s=3.0: LoadSeen(
        wall_s=window_s, other_cores=1.4, own_cores=0, steal_cores=0, cpus=2))


def test_hardware_calibrate_refuses_a_busy_machine_in_one_line(capsys, monkeypatch, tmp_path):
    _busy(monkeypatch)
    out = tmp_path / "here.yaml"
    code, text, err = _cli(capsys, "hardware", "calibrate", "here", "--wait", "0", "-o", str(out))
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and "machine busy: others used 1.40 of 2 core(s)" in err and "--allow-busy" in err


@pytest.mark.parametrize("verdict, code", [("PASS", 0), ("FAIL", 1), ("NOT VALID (measured under other load)", 3)])
def test_e2e_cpu_exit_code_is_its_verdict(capsys, monkeypatch, verdict, code):
    from raytune_primus.e2e import runner
    res = {"runs": [], "verdict": verdict, "benchmark_max_abs_error": 0.0, "benchmark_same_ranking": True,
           "simulate_same_ranking": True, "seconds": 1.0}
    monkeypatch.setattr(runner, "run_e2e", lambda **kw: res)
    assert _cli(capsys, "e2e-cpu")[0] == code


def test_e2e_cpu_on_a_busy_machine_is_one_line_and_not_valid(capsys, monkeypatch):
    from raytune_primus.e2e import runner

    def busy(**kw):
        raise runner.BusyMachine("machine busy before starting: others used 1.40 of 2 core(s)")
    monkeypatch.setattr(runner, "run_e2e", busy)
    code, out, err = _cli(capsys, "e2e-cpu", "--wait", "0")
    assert code == 3 and err.startswith("error: machine busy") and err.count("\n") == 1
