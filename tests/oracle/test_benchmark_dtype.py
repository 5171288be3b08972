"""Benchmark mode's compute dtype: chosen by capability (bf16 where the device runs it natively, else fp32),
guarded by a probe, both branches with the capability probe patched; what it changes in measurements and in
``hardware calibrate``."""
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from oracle.benchmark import calibrate as cal  # noqa: E402
from oracle.benchmark import dtype as dt  # noqa: E402
from oracle.benchmark.load import LoadMonitor  # noqa: E402
from oracle.benchmark.source import Bencher  # noqa: E402
from oracle.benchmark.spec import LayerSpec  # noqa: E402
from oracle.errors import BenchmarkError  # noqa: E402
from oracle.hardware import load_hardware  # noqa: E402

CPU = torch.device("cpu")
NATIVE = {"bf16": 180e9, "fp32": 90e9}  # a CPU with bf16 units: bf16 GEMMs twice fp32
EMULATED = {"bf16": 1e9, "fp32": 90e9}  # AVX2 only: bf16 on torch's reference path


@pytest.fixture(autouse=True)
def _fresh():
    dt.forget_choices()
    yield
    dt.forget_choices()


def _patch(monkeypatch, capable, probe):
    calls = []
    monkeypatch.setattr(dt, "bf16_capability", lambda device: (capable, f"patched capable={capable}"))

    def fake_probe(device, *a, **k):
        calls.append(device)
        return dict(probe)
    monkeypatch.setattr(dt, "gemm_probe", fake_probe)
    return calls


@pytest.mark.parametrize("capable, probe, expect", [
    (True, NATIVE, "bf16"),  # AMX / AVX512-BF16 machine: as before
    (False, EMULATED, "fp32"),  # AVX2 only
    (False, NATIVE, "fp32"),  # no units: fp32 even where the emulation is quick
    (True, EMULATED, "fp32"),  # units present but torch's bf16 GEMM does not use them
    (None, NATIVE, "bf16"),  # capability unreadable: the probe decides
    (None, EMULATED, "fp32"),
])
def test_the_dtype_follows_the_capability_guarded_by_the_probe(monkeypatch, capable, probe, expect):
    _patch(monkeypatch, capable, probe)
    c = dt.choose_dtype(CPU)
    assert c.dtype == expect and c.bf16_native is capable and c.probe_flops_per_s == probe
    assert c.native == (expect == "bf16")
    assert f"timed in {expect}" in c.note() and "patched" in c.note()


def test_a_forced_dtype_needs_no_probe_and_a_bad_one_is_one_line(monkeypatch):
    calls = _patch(monkeypatch, True, NATIVE)
    c = dt.choose_dtype(CPU, "fp32")
    assert c.dtype == "fp32" and not calls and "forced by --dtype fp32" in c.note()
    with pytest.raises(BenchmarkError, match="dtype='fp16' is not one of auto, bf16, fp32"):
        dt.choose_dtype(CPU, "fp16")


def test_a_gpu_is_asked_not_probed(monkeypatch):
    calls = _patch(monkeypatch, True, EMULATED)
    gpu = SimpleNamespace(type="cuda")
    assert dt.choose_dtype(gpu).dtype == "bf16" and not calls
    _patch(monkeypatch, False, NATIVE)
    dt.forget_choices()
    assert dt.choose_dtype(gpu).dtype == "fp32"


def test_the_choice_is_made_once_per_process_and_device(monkeypatch):
    calls = _patch(monkeypatch, False, EMULATED)
    assert dt.choose_dtype(CPU) is dt.choose_dtype(CPU)
    assert len(calls) == 1


@pytest.mark.parametrize("flags, expect", [
    ({"avx2", "fma"}, False), ({"avx2", "avx512f", "avx512_bf16"}, True), ({"amx_bf16", "amx_tile"}, True),
    ({"asimd", "bf16"}, True), (None, None),
])
def test_cpu_capability_reads_the_bf16_flags(monkeypatch, flags, expect):
    monkeypatch.setattr(dt, "_cpu_flags", lambda: flags)
    ok, evidence = dt.bf16_capability(CPU)
    assert ok is expect and "torch CPU capability" in evidence


def test_the_probe_measures_both_dtypes():
    rates = dt.gemm_probe(CPU, ("fp32",), repeats=1, min_s=0.0)
    assert set(rates) == {"fp32"} and rates["fp32"] > 0


@pytest.mark.parametrize("capable, probe, expect", [(True, NATIVE, "bf16"), (False, EMULATED, "fp32")])
def test_layers_are_timed_and_labelled_in_the_chosen_dtype(monkeypatch, tmp_path, capable, probe, expect):
    _patch(monkeypatch, capable, probe)
    b = Bencher(cache_dir=str(tmp_path), repeats=1, warmup=0, per_op=False, device="cpu")
    spec = LayerSpec(kind="dense", hidden=32, mbs=1, seq_q=8, seq_k=8, heads=2, kv_heads=1, head_dim=16, ffn=64)
    m = b.measure(spec)
    assert b.compute.dtype == expect and m.dtype == expect and spec.dtype == "bf16"
    assert b.settings.compute_dtype == expect  # part of the cache key: a bf16 and an fp32 timing never mix


def _fake_kernels(device, dtype="bf16"):
    return {"dtype": dtype, "gemm_flops": 60e9, "attention_fwd_flops": 20e9, "attention_bwd_flops": 15e9,
            "copy_bytes_per_s": 20e9, "tiny_op_s": 5e-6}


@pytest.mark.parametrize("capable, probe", [(True, NATIVE), (False, EMULATED)])
def test_calibrate_measures_in_the_native_dtype_and_says_what_bf16_means(monkeypatch, capable, probe):
    _patch(monkeypatch, capable, probe)
    seen = []
    monkeypatch.setattr(cal, "measure_kernels", lambda device, dtype: seen.append(dtype) or _fake_kernels(device, dtype))
    data, raw = cal.calibrate(base="cpu-host", name="here", threads=1, device="cpu", monitor=LoadMonitor())
    base = load_hardware("cpu-host")
    per_core = {k: v / base.num_compute_units / 1e12 for k, v in base.peak_flops_per_s.items()}
    peaks = data["compute"]["peak_tflops"]
    if capable:
        assert seen == ["bf16"] and raw["compute_dtype"]["dtype"] == "bf16"
        assert peaks["bf16"] == pytest.approx(per_core["bf16"], rel=1e-4)  # the base's bf16 peak, as before
        assert "peak_bf16" not in data["sources"]
        assert data["efficiency"]["gemm_bf16"]["value"] == pytest.approx(60e9 / (per_core["bf16"] * 1e12), rel=1e-3)
    else:
        assert seen == ["fp32"] and raw["compute_dtype"]["dtype"] == "fp32"
        assert peaks["bf16"] == peaks["fp32"] == pytest.approx(per_core["fp32"], rel=1e-4)
        assert "bf16 training on this device computes in fp32" in data["sources"]["peak_bf16"]
        assert data["efficiency"]["gemm_bf16"]["value"] == pytest.approx(60e9 / (per_core["fp32"] * 1e12), rel=1e-3)
        assert "fp32 matmul" in data["efficiency"]["gemm_bf16"]["source"]
    assert "timed in" in data["sources"]["compute_dtype"]
    assert "load" in data["sources"]


def test_a_profile_calibrated_in_fp32_describes_fp32_training_even_when_forced(monkeypatch):
    """e2e-cpu's trainer computes in the dtype it calibrated in: forced fp32 on a bf16 machine, the profile's bf16
    peak is the fp32 one too, so benchmark mode re-prices nothing on it."""
    _patch(monkeypatch, True, NATIVE)
    monkeypatch.setattr(cal, "measure_kernels", lambda device, dtype: _fake_kernels(device, dtype))
    data, raw = cal.calibrate(base="cpu-host", name="here", threads=1, device="cpu", dtype="fp32",
                              monitor=LoadMonitor())
    peaks = data["compute"]["peak_tflops"]
    assert raw["kernels"]["dtype"] == "fp32" and peaks["bf16"] == peaks["fp32"]
    assert "forced by --dtype fp32" in data["sources"]["peak_bf16"]
