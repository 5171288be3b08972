"""Security of what the tool reads (issue 13, item 7): safe YAML only, names that never reach the file
system unchecked, model-card imports that refuse absurd sizes instead of allocating.

The API-key scrubber has its own tests (tests/searchers/test_ledger.py, tests/searchers/test_llm.py).
"""
from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest

from oracle.errors import InvalidConfigError, PrimusError
from raytune_primus.cli import main
from tests.conftest import ROOT

HF = ROOT / "tests" / "fixtures" / "hf"
CONFIG = ROOT / "tests" / "fixtures" / "configs" / "llama70b-h100.yaml"


def _evil(marker: Path) -> str:
    """A YAML tag that would run a shell command under an unsafe loader."""
    return f'!!python/object/apply:os.system ["touch {marker}"]'


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------- safe YAML
def test_no_unsafe_yaml_loader_anywhere_in_the_source():
    """Every YAML read goes through yaml.safe_load (oracle.yamlio.load_mapping or the --set parser)."""
    pattern = re.compile(r"yaml\.(load|load_all|unsafe_load|unsafe_load_all|full_load|full_load_all)\(|Loader\s*=")
    offenders = []
    for folder in ("oracle", "searchers", "raytune_primus", "scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, offenders


def _files_with_a_python_tag(tmp_path: Path, marker: Path) -> dict[str, tuple[Path, object]]:
    """(path, loader) per kind of file the tool reads, each with a python/object tag somewhere in it."""
    from oracle.config import RunConfig
    from oracle.hardware import load_hardware
    from oracle.model_card import load_model
    from searchers.experiment import load_experiment

    evil = _evil(marker)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.read_text().replace("num_gpus: 64", f"num_gpus: {evil}"))
    card = tmp_path / "card.yaml"
    card.write_text((ROOT / "oracle" / "models" / "tiny-moe.yaml").read_text() + f"\nnotes: {evil}\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text((ROOT / "hardware" / "h100-sxm.yaml").read_text() + f"\ndescription: {evil}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / "experiments" / "tiny-moe-h100-8.yaml").read_text() + f"\nbudget: {evil}\n")
    return {"config": (config, RunConfig.load), "model card": (card, lambda p: load_model(str(p))),
            "hardware profile": (profile, lambda p: load_hardware(str(p))),
            "experiment spec": (spec, load_experiment)}


@pytest.mark.parametrize("kind", ["config", "model card", "hardware profile", "experiment spec"])
def test_a_python_object_tag_is_refused_with_a_clear_error(tmp_path, kind):
    marker = tmp_path / "pwned"
    path, load = _files_with_a_python_tag(tmp_path, marker)[kind]
    with pytest.raises(InvalidConfigError) as e:
        load(path)
    msg = str(e.value)
    assert "'!!python/object/apply:os.system'" in msg and "refused" in msg and "safe loader" in msg, msg
    assert str(path) in msg and re.search(r"at line \d+, column \d+", msg)
    assert not marker.exists(), "the command never ran"


def test_the_cli_refuses_a_python_tag_in_one_line(tmp_path, capsys):
    marker = tmp_path / "pwned"
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.read_text().replace("num_gpus: 64", f"num_gpus: {_evil(marker)}"))
    code, out, err = _cli(capsys, "project", str(config))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: config file") and "python/object" in err and not marker.exists()


def test_a_python_tag_in_a_set_override_stays_a_string():
    from oracle.config import _parse_scalar

    assert _parse_scalar('!!python/object/apply:os.system ["true"]') == '!!python/object/apply:os.system ["true"]'


@pytest.mark.parametrize("text, expected", [
    ("a: " + "9" * 5000 + "\n", "Exceeds the limit (4300 digits)"),  # int() refuses it: one line, not a traceback
    ("a: &x [1]\nb: *y\n", "found undefined alias"),
    ("[" * 5000 + "]" * 5000 + "\n", "not valid YAML/JSON"),
])
def test_hostile_yaml_is_one_line(tmp_path, text, expected):
    from oracle.yamlio import load_mapping

    p = tmp_path / "x.yaml"
    p.write_text(text)
    with pytest.raises(InvalidConfigError) as e:
        load_mapping(p, "config file")
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_an_oversized_file_is_not_read(tmp_path):
    from oracle.yamlio import MAX_FILE_BYTES, load_mapping

    p = tmp_path / "huge.yaml"
    with open(p, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(InvalidConfigError, match=r"is 16,777,217 bytes; at most 16,777,216 are read"):
        load_mapping(p, "model card")


# ---------------------------------------------------------------------------------- names
LONG = "h" * 5000


@pytest.mark.parametrize("where, value", [
    ("hardware", LONG), ("model", LONG), ("hardware", "x" * 300 + ".yaml"), ("model", "dir/" + "m" * 256 + ".yaml"),
    ("hardware", "h100\x00-sxm"), ("model", "llama\n3"), ("hardware", ""), ("model", 17), ("hardware", ["h100-sxm"]),
])
def test_bad_names_in_a_config_are_clear_errors_not_oserrors(tmp_path, capsys, where, value):
    import yaml

    data = yaml.safe_load(CONFIG.read_text())
    if where == "hardware":
        data["cluster"]["hardware"] = value
    else:
        data["model"] = value
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    code, out, err = _cli(capsys, "project", str(p))
    assert code == 2 and out == "", err
    assert "OSError" not in err and "Traceback" not in err and "File name too long" not in err
    assert 0 < len(err) < 1000, err  # the value is cut short in the message
    assert all(line.startswith("error: ") for line in err.strip().splitlines())


@pytest.mark.parametrize("value", [LONG, "e" * 300 + ".yaml", "exp\x00"])
def test_bad_experiment_names_are_clear_errors(value):
    from searchers.experiment import load_experiment

    with pytest.raises(PrimusError) as e:
        load_experiment(value)
    assert len(str(e.value)) < 400 and "experiment" in str(e.value)


def test_the_registry_checks_names_before_touching_the_file_system(monkeypatch):
    from oracle.hardware import load_hardware

    def boom(*a, **k):
        raise AssertionError("the file system was asked about a 5,000-character name")

    monkeypatch.setattr(Path, "exists", boom)
    monkeypatch.setattr(Path, "stat", boom)
    too_long = r"hardware profile 'h{60}'\.\.\. \(5,000 characters\) is too long"
    with pytest.raises(InvalidConfigError, match=too_long):
        load_hardware(LONG)


def test_long_but_legal_names_still_load(tmp_path):
    """250 characters is a legal file name: the limit is the file system's, not shorter."""
    from oracle.hardware import load_hardware

    p = tmp_path / ("p" * 245 + ".yaml")
    p.write_text((ROOT / "hardware" / "h100-sxm.yaml").read_text())
    assert load_hardware(str(p)).peak_flops_per_s == load_hardware("h100-sxm").peak_flops_per_s


# ---------------------------------------------------------------------------------- model-card import
FAMILIES = sorted(p.name for p in HF.iterdir() if (p / "config.json").exists() and p.name != "malformed")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key, value", [("hidden_size", 10**12), ("num_hidden_layers", 10**9),
                                        ("vocab_size", 10**15), ("intermediate_size", 2**40),
                                        ("num_attention_heads", 10**7), ("max_position_embeddings", 10**12)])
def test_absurd_sizes_are_refused_before_anything_is_allocated(family, key, value):
    from oracle.hf_import import SIZE_LIMITS, card_from_hf_config

    data = json.loads((HF / family / "config.json").read_text())
    card_from_hf_config(dict(data), family)  # the real config imports
    data[key] = value
    tracemalloc.start()
    try:
        with pytest.raises(InvalidConfigError) as e:
            card_from_hf_config(data, family)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"config.json {key}={value:,} is absurd: at most {SIZE_LIMITS[key]:,} is accepted" in str(e.value)
    assert peak_bytes < 2**20, "refused without sizing anything by it"


@pytest.mark.parametrize("key, value", [("hidden_size", 10**12), ("num_hidden_layers", 10**9),
                                        ("num_local_experts", 10**9), ("interleave_moe_layer_step", 10**9)])
def test_absurd_sizes_inside_a_wrappers_text_config_are_refused_too(key, value):
    from oracle.hf_import import SIZE_LIMITS, card_from_hf_config

    data = json.loads((HF / "llama-4-maverick" / "config.json").read_text())
    data["text_config"][key] = value
    with pytest.raises(InvalidConfigError) as e:
        card_from_hf_config(data, "llama-4-maverick")
    assert f"config.json text_config {key}={value:,} is absurd: at most {SIZE_LIMITS[key]:,}" in str(e.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, 10**5000], ids=["nan", "inf", "1e300", "10**5000"])
def test_non_finite_and_enormous_layer_counts_are_refused(value):
    from oracle.hf_import import card_from_hf_config

    data = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    data["num_hidden_layers"] = value
    with pytest.raises(InvalidConfigError, match=r"config.json num_hidden_layers=.* is absurd"):
        card_from_hf_config(data, "x")


def test_a_huge_per_layer_list_is_refused():
    from oracle.hf_import import card_from_hf_config

    data = json.loads((HF / "gpt-oss-120b" / "config.json").read_text())
    data["layer_types"] = ["full_attention"] * 100_000
    with pytest.raises(InvalidConfigError, match=r"layer_types has 100,000 entries: at most 10,000"):
        card_from_hf_config(data, "x")


def test_models_import_of_an_absurd_config_is_one_line(tmp_path, capsys):
    data = json.loads((HF / "qwen3-30b-a3b" / "config.json").read_text())
    data["hidden_size"] = 10**12
    data["num_hidden_layers"] = 10**9
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    code, out, err = _cli(capsys, "models", "import", str(p))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all("is absurd" in line for line in lines), err


def test_the_registry_cache_is_bounded(tmp_path):
    """Loading many distinct files (a fuzz run, a long session) keeps at most CACHE_ENTRIES parsed profiles."""
    from oracle import registry
    from oracle.hardware import _REGISTRY, load_hardware

    text = (ROOT / "hardware" / "h100-sxm.yaml").read_text()
    for i in range(registry.CACHE_ENTRIES + 40):
        p = tmp_path / f"p{i}.yaml"
        p.write_text(text)
        load_hardware(str(p))
    assert len(_REGISTRY._cache) == registry.CACHE_ENTRIES
    assert load_hardware("h100-sxm") is load_hardware("h100-sxm"), "still a cache"
