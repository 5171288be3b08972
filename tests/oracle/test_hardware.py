"""Bundled hardware profiles load, carry sourced efficiencies, and bad profiles fail with clear errors."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from hardware import PROFILE_DIR
from oracle.errors import HardwareProfileError, InvalidConfigError, UnknownComponentError
from oracle.hardware import Efficiency, HardwareProfile, bundled_hardware, load_hardware
from oracle.units import GB, GIB

REQUIRED = {"mi300x", "mi325x", "mi355x", "a100-80gb", "h100-sxm", "h200-sxm", "b200", "b300",
            "gb200-nvl72", "gb300-nvl72", "cpu-host"}
NO_FP8 = {"a100-80gb", "a100-40gb", "cpu-host"}
NVL72 = {"gb200-nvl72", "gb300-nvl72"}
EFFICIENCY_FIELDS = [f.name for f in dataclasses.fields(Efficiency)]
FRACTIONS = [n for n in EFFICIENCY_FIELDS if n not in ("gemm_k_half", "kernel_launch_s", "collective_launch_s",
                                                        "grouped_gemm_overhead_s",
                                                        "moe_sync_stall_s")]


def _raw(name: str) -> dict:
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- bundled profiles


def test_required_profiles_are_bundled():
    assert REQUIRED <= set(bundled_hardware()), sorted(REQUIRED - set(bundled_hardware()))


@pytest.mark.parametrize("name", bundled_hardware())
def test_bundled_profile_loads(name):
    hw = load_hardware(name)
    assert isinstance(hw, HardwareProfile)
    assert hw.name == name, f"{name}.yaml says name: {hw.name!r}; the file name is the key"
    assert hw.vendor in ("nvidia", "amd", "cpu")
    assert hw.supports("bf16") and hw.peak_flops("bf16") > 0
    assert hw.num_compute_units >= 1
    assert hw.hbm_capacity_bytes > hw.runtime_reserved_bytes >= 0
    assert hw.hbm_bandwidth_bytes_per_s > 0
    assert hw.scale_up_bandwidth_bytes_per_s > 0 and hw.scale_out_bandwidth_bytes_per_s > 0
    assert hw.scale_up_latency_s >= 0 and hw.scale_out_latency_s >= 0
    # a scale-up domain is whole servers; a pod (when given) is whole scale-up domains
    assert hw.scale_up_domain_size % hw.gpus_per_node == 0
    if hw.pod_size is not None:
        assert hw.pod_size % hw.scale_up_domain_size == 0
    # scale-out never beats scale-up on these parts
    assert hw.scale_out_bandwidth_bytes_per_s <= hw.scale_up_bandwidth_bytes_per_s


@pytest.mark.parametrize("name", bundled_hardware())
def test_every_efficiency_has_a_value_and_a_source(name):
    hw = load_hardware(name)
    assert set(hw.efficiency_sources) == set(EFFICIENCY_FIELDS)
    for field in EFFICIENCY_FIELDS:
        assert hw.efficiency_sources[field].strip(), f"{name}: efficiency.{field} has an empty source"
    eff = hw.efficiency
    for field in FRACTIONS:
        value = getattr(eff, field)
        if field in ("gemm_fp8", "gemm_fp4") and not hw.supports(field[-3:]):
            assert value == 0.0, f"{name} has no {field[-3:]} peak, so {field} should be 0 (not applicable)"
            continue
        if field == "attention_exp_overlap":  # a share of the shorter pipe hidden: 0 (they add up) to 1
            assert 0.0 <= value <= 1.0, f"{name}: efficiency.{field}={value} is not in [0, 1]"
            continue
        if field == "gemm_mxfp8" and value == 0.0:  # a part without MXFP8 GEMMs: the source says so
            assert hw.efficiency_sources[field].startswith("not applicable") and not hw.mxfp8_gemms
            continue
        assert 0.0 < value <= 1.0, f"{name}: efficiency.{field}={value} is not a fraction in (0, 1]"
    assert eff.gemm_k_half >= 1
    assert 0 < eff.kernel_launch_s < 1e-3 and 0 < eff.collective_launch_s < 1e-3
    assert 0 < eff.host_op_s < 1e-3, f"{name}: host issue time per framework op must be in (0, 1 ms)"
    # a host stall per MoE-layer forward: zero (no queue to drain) up to tens of milliseconds
    assert 0 <= eff.moe_sync_stall_s < 0.05
    assert 0 <= eff.grouped_gemm_overhead_s < 1e-3  # a kernel's fill, drain and gap: microseconds
    if hw.vendor != "cpu":
        assert eff.moe_sync_stall_s > 0, f"{name}: a GPU's dispatcher sync stall is not free"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_fp8_support_where_expected(name):
    hw = load_hardware(name)
    assert hw.supports("fp8") == (name not in NO_FP8)
    if name in NO_FP8:
        with pytest.raises(InvalidConfigError, match=r"no fp8 peak; supported: .*bf16"):
            hw.peak_flops("fp8")
    else:
        assert hw.peak_flops("fp8") == pytest.approx(2 * hw.peak_flops("bf16"), rel=0.01)


@pytest.mark.parametrize("name", bundled_hardware())
def test_memory_cap_is_hbm_minus_reserve_times_0_9(name):
    hw = load_hardware(name)
    mem = _raw(name)["memory"]
    expected = (mem["hbm_capacity_gib"] - mem["runtime_reserved_gib"]) * GIB * 0.9
    assert hw.memory_cap_bytes() == pytest.approx(expected)
    assert hw.memory_cap_bytes(0.05) == pytest.approx(expected / 0.9 * 0.95)
    assert hw.hbm_capacity_bytes == pytest.approx(mem["hbm_capacity_gib"] * GIB)
    assert hw.hbm_bandwidth_bytes_per_s == pytest.approx(mem["hbm_bandwidth_gb_per_s"] * GB)


@pytest.mark.parametrize("name", sorted(NVL72))
def test_nvl72_has_a_72_gpu_scale_up_domain(name):
    hw = load_hardware(name)
    assert hw.scale_up_domain_size == 72
    assert hw.gpus_per_node == 4
    assert hw.scale_up_bandwidth_bytes_per_s == pytest.approx(900 * GB)


@pytest.mark.parametrize("name, bf16_tflops, hbm_gib, hbm_gb_s, units, scale_up_gb_s, nic_gb_s", [
    ("a100-80gb", 312, 80, 2039, 108, 300, 25),
    ("a100-40gb", 312, 40, 1555, 108, 300, 25),
    ("h800-sxm", 989, 80, 3350, 132, 200, 50),
    ("h100-sxm", 989, 80, 3350, 132, 450, 50),
    ("h200-sxm", 989, 141, 4800, 132, 450, 50),
    ("b200", 2250, 180, 7700, 148, 900, 50),
    ("b300", 2250, 270, 7700, 160, 900, 100),
    ("gb200-nvl72", 2450, 186, 8000, 148, 900, 50),
    ("gb300-nvl72", 2450, 279, 8000, 160, 900, 100),
    ("mi300x", 1307.4, 192, 5300, 304, 448, 50),
    ("mi325x", 1307.4, 256, 6000, 304, 448, 50),
    ("mi355x", 2500, 288, 8000, 256, 537.6, 50),
])
def test_spec_numbers_match_the_reference(name, bf16_tflops, hbm_gib, hbm_gb_s, units, scale_up_gb_s, nic_gb_s):
    """Key spec numbers as documented in docs/hardware.md (sources there and in each YAML)."""
    hw = load_hardware(name)
    assert hw.peak_flops("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert hw.hbm_capacity_bytes == pytest.approx(hbm_gib * GIB)
    assert hw.hbm_bandwidth_bytes_per_s == pytest.approx(hbm_gb_s * GB)
    assert hw.num_compute_units == units
    assert hw.scale_up_bandwidth_bytes_per_s == pytest.approx(scale_up_gb_s * GB)
    assert hw.scale_out_bandwidth_bytes_per_s == pytest.approx(nic_gb_s * GB)


def test_cpu_host_is_a_single_device_with_loopback_networking():
    hw = load_hardware("cpu-host")
    assert hw.vendor == "cpu" and hw.gpus_per_node == 1 and hw.scale_up_domain_size == 1
    assert hw.peak_flops("bf16") < 10e12  # a CPU, not an accelerator
    assert not hw.supports("fp16")


# ---------------------------------------------------------------- bad profiles


def _write(tmp_path: Path, data, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data,
                    encoding="utf-8")
    return path


def _broken(tmp_path: Path, mutate) -> Path:
    data = copy.deepcopy(_raw("h100-sxm"))
    mutate(data)
    return _write(tmp_path, data)


def test_a_copy_of_a_bundled_profile_loads_by_path(tmp_path):
    path = _broken(tmp_path, lambda d: None)
    hw = load_hardware(str(path))
    assert hw.peak_flops("bf16") == load_hardware("h100-sxm").peak_flops("bf16")


def test_a_profile_based_on_a_bundled_one_changes_only_what_it_says(tmp_path):
    p = tmp_path / "my-h100.yaml"
    p.write_text("based_on: h100-sxm\nnetwork: {scale_out: {bandwidth_gb_per_s: 25}}\nmemory: {hbm_capacity_gib: 94}\n"
                 "efficiency:\n  gemm_bf16: {value: 0.6, source: 'our own 8192^3 GEMM benchmark'}\n")
    hw, base = load_hardware(str(p)), load_hardware("h100-sxm")
    assert (hw.name, hw.scale_out_bandwidth_bytes_per_s, hw.hbm_capacity_bytes) == ("my-h100", 25 * GB, 94 * GIB)
    assert hw.aliases == () and hw.description.startswith("based on h100-sxm: ")  # the base's names are its own
    assert (hw.efficiency.gemm_bf16, hw.efficiency_sources["gemm_bf16"]) == (0.6, "our own 8192^3 GEMM benchmark")
    changed = {"name", "description", "aliases", "scale_out_bandwidth_bytes_per_s", "hbm_capacity_bytes", "efficiency",
               "efficiency_sources", "_hash"}
    for f in dataclasses.fields(HardwareProfile):
        if f.name not in changed:
            assert getattr(hw, f.name) == getattr(base, f.name), f.name
    assert dataclasses.replace(hw.efficiency, gemm_bf16=base.efficiency.gemm_bf16) == base.efficiency
    assert {k: v for k, v in hw.efficiency_sources.items() if k != "gemm_bf16"} == {
        k: v for k, v in base.efficiency_sources.items() if k != "gemm_bf16"}


@pytest.mark.parametrize("text, needle", [
    ("based_on: rtx4090\n", "based_on: unknown hardware profile 'rtx4090'; valid: "),
    ("based_on: [1]\n", "based_on=[1] must name a bundled hardware profile"),
    ("based_on: ./other.yaml\n", "must name a bundled hardware profile, not a file"),
    # a value given here never takes the base's source: it needs its own
    ("based_on: h100-sxm\nefficiency: {gemm_bf16: {value: 0.5}}\n", "needs a non-empty 'source'"),
    ("based_on: h100-sxm\nefficiency: {gemm_bf16: 0.5}\n", "gemm_bf16 must be {value: X, source: '...'}"),
])
def test_a_bad_based_on_profile_is_one_clear_error(tmp_path, text, needle):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(HardwareProfileError) as err:
        load_hardware(str(p))
    assert needle in str(err.value)


def test_unknown_key_is_rejected_with_a_suggestion(tmp_path):
    def mutate(d):
        d["memory"]["hbm_capacity_gb"] = d["memory"].pop("hbm_capacity_gib")
    with pytest.raises(HardwareProfileError) as err:
        load_hardware(str(_broken(tmp_path, mutate)))
    msg = str(err.value)
    assert "unknown key 'hbm_capacity_gb'" in msg
    assert "did you mean 'hbm_capacity_gib'" in msg
    assert "is incomplete, missing memory.hbm_capacity_gib:" in msg


def test_unknown_top_level_key_is_rejected(tmp_path):
    with pytest.raises(HardwareProfileError, match=r"unknown key 'efficency'.*did you mean 'efficiency'"):
        load_hardware(str(_broken(tmp_path, lambda d: d.__setitem__("efficency", {}))))


def test_missing_section_is_named(tmp_path):
    with pytest.raises(HardwareProfileError, match=r"is incomplete, missing network: a profile needs sections"):
        load_hardware(str(_broken(tmp_path, lambda d: d.pop("network"))))


def test_list_where_a_mapping_belongs(tmp_path):
    with pytest.raises(HardwareProfileError, match=r"\.memory must be a mapping, got list"):
        load_hardware(str(_broken(tmp_path, lambda d: d.__setitem__("memory", [80, 3350, 2.0]))))


def test_peak_tflops_must_be_a_mapping(tmp_path):
    with pytest.raises(HardwareProfileError, match=r"peak_tflops must be a mapping"):
        load_hardware(str(_broken(tmp_path, lambda d: d["compute"].__setitem__("peak_tflops", [989, 1979]))))


def test_negative_bandwidth_is_rejected_with_its_value(tmp_path):
    def mutate(d):
        d["network"]["scale_out"]["bandwidth_gb_per_s"] = -50
    with pytest.raises(HardwareProfileError, match=r"scale_out\.bandwidth_gb_per_s=-50 must be > 0"):
        load_hardware(str(_broken(tmp_path, mutate)))


def test_efficiency_without_source_is_rejected(tmp_path):
    def mutate(d):
        d["efficiency"]["hbm"] = {"value": 0.85}
        d["efficiency"]["gemm_bf16"] = {"value": 0.8, "source": "  "}
    with pytest.raises(HardwareProfileError) as err:
        load_hardware(str(_broken(tmp_path, mutate)))
    msg = str(err.value)
    assert "efficiency.hbm needs a non-empty 'source'" in msg
    assert "efficiency.gemm_bf16 needs a non-empty 'source'" in msg


def test_missing_efficiency_field_is_rejected(tmp_path):
    with pytest.raises(HardwareProfileError, match=r"is incomplete, missing efficiency\.attention_bwd: "):
        load_hardware(str(_broken(tmp_path, lambda d: d["efficiency"].pop("attention_bwd"))))


def test_all_problems_are_reported_together(tmp_path):
    def mutate(d):
        d.pop("network")
        d["memory"]["hbm_bandwidth_gb_per_s"] = 0
        d["compute"]["peak_tflops"].pop("bf16")
    with pytest.raises(HardwareProfileError) as err:
        load_hardware(str(_broken(tmp_path, mutate)))
    lines = str(err.value).splitlines()
    assert any("is incomplete, missing network:" in line for line in lines)
    assert len(lines) == 3  # the missing keys in one line, each other problem in its own
    assert any("hbm_bandwidth_gb_per_s=0 must be > 0" in line for line in lines)
    assert any("needs a bf16 entry" in line for line in lines)


def test_missing_file_is_an_invalid_config(tmp_path):
    with pytest.raises(InvalidConfigError, match=r"does not exist"):
        load_hardware(str(tmp_path / "nope.yaml"))


def test_malformed_yaml_is_an_invalid_config_with_a_location(tmp_path):
    path = _write(tmp_path, "name: x\ncompute: {peak_tflops: {bf16: 989\nmemory: [\n")
    with pytest.raises(InvalidConfigError, match=r"not valid YAML/JSON at line \d+"):
        load_hardware(str(path))


def test_top_level_list_is_an_invalid_config(tmp_path):
    with pytest.raises(InvalidConfigError, match=r"must hold a mapping at the top level, got a list"):
        load_hardware(str(_write(tmp_path, [1, 2, 3])))


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(UnknownComponentError) as err:
        load_hardware("h1000-sxm")
    msg = str(err.value)
    assert "unknown hardware profile 'h1000-sxm'" in msg
    for name in REQUIRED:
        assert name in msg
    assert set(err.value.valid) == set(bundled_hardware())


def test_calibration_groups_parts_by_the_profiles_own_arch_and_vendor():
    """benchmarks/calibrate.py reads each part's generation (``arch``) and software stack (``vendor``) from its
    profile; every bundled accelerator belongs to exactly one fit family (a new arch must be placed in one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "calibrate_groups_for_test", Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate.py")
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    accelerators = [n for n in bundled_hardware() if load_hardware(n).vendor in ("nvidia", "amd")]
    assert accelerators
    for name in accelerators:
        hw = load_hardware(name)
        assert cal.generation_of(name) == hw.arch and name in cal.GENERATIONS[hw.arch]
        assert cal.host_group_of(hw.arch) == hw.vendor
        assert sum(name in parts for parts in cal.FAMILIES.values()) == 1, name
