"""Published tables spell parts and models their own way: the registries' loose lookup (case and
punctuation aside, plus the aliases a bundled file lists) maps those spellings onto bundled names,
and never guesses between two."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from hardware import PROFILE_DIR
from oracle.errors import HardwareProfileError, InvalidConfigError, UnknownComponentError
from oracle.hardware import bundled_hardware, load_hardware
from oracle.model_card import MODEL_DIR, bundled_models, load_model
from oracle.registry import YamlRegistry, loose_key


@pytest.mark.parametrize("spelling, name", [
    ("H100-SXM-80GB", "h100-sxm"), ("h100", "h100-sxm"), ("DGX-H100", "h100-sxm"),
    ("H200-SXM-141GB", "h200-sxm"), ("A100-SXM-80GB", "a100-80gb"), ("GB200", "gb200-nvl72"),
    ("GB200_NVL72", "gb200-nvl72"), ("GB300", "gb300-nvl72"), ("DGX-B200", "b200"), ("B300", "b300"),
    ("MI355X", "mi355x"), ("AMD-Instinct-MI300X", "mi300x"), ("H800", "h800-sxm"), ("A100", "a100-80gb"),
    ("A100-SXM4-40GB", "a100-40gb"), ("H100-80GB", "h100-sxm"),
])
def test_hardware_reference_spellings_resolve(spelling, name):
    assert load_hardware(spelling).name == name


@pytest.mark.parametrize("spelling, name", [
    ("Qwen3_30B_a3B", "qwen3-30b-a3b"), ("DeepSeek-V3", "deepseek-v3"), ("DSV3", "deepseek-v3"),
    ("Llama-3.1-405B", "llama3.1-405b"), ("Meta-Llama-3.1-405B", "llama3.1-405b"), ("LLAMA3_8B", "llama3-8b"),
    ("Mixtral-8x22B-v0.1", "mixtral-8x22b"), ("GPT-OSS-120B", "gpt-oss-120b"), ("Llama-3.3-70B", "llama3.1-70b"),
    ("Llama4_E128", "llama4-maverick"), ("Llama-4-Scout-17B-16E", "llama4-scout"), ("Qwen2.5-72B", "qwen2.5-72b"),
    ("Qwen3-32B", "qwen3-32b"), ("Mistral-7B-v0.1", "mistral-7b"), ("DeepSeek-V2-Lite", "deepseek-v2-lite"),
])
def test_model_spellings_resolve(spelling, name):
    assert load_model(spelling).name == name


def test_loose_keys_of_bundled_names_and_aliases_are_unique():
    """No two bundled files may claim one loose key, or a published spelling would be ambiguous."""
    for names, directory in ((bundled_hardware(), Path(PROFILE_DIR)), (bundled_models(), Path(MODEL_DIR))):
        owner: dict[str, str] = {}
        for n in names:
            data = yaml.safe_load((directory / f"{n}.yaml").read_text())
            for key in {loose_key(k) for k in [n, *(data.get("aliases") or [])]}:
                assert owner.setdefault(key, n) == n, f"{n} and {owner[key]} both claim {key!r}"


def test_unknown_spelling_still_lists_the_valid_names():
    with pytest.raises(UnknownComponentError) as err:
        load_hardware("H999-SXM")
    assert "h100-sxm" in str(err.value)


def _copy_dir(src: Path, dst: Path, names: list[str]) -> None:
    dst.mkdir()
    for n in names:
        shutil.copy(src / f"{n}.yaml", dst / f"{n}.yaml")


def test_an_ambiguous_spelling_is_an_error_naming_both(tmp_path):
    d = tmp_path / "profiles"
    _copy_dir(Path(PROFILE_DIR), d, ["b200", "b300"])
    for n in ("b200", "b300"):  # both claim the alias "Blackwell"
        p = d / f"{n}.yaml"
        p.write_text(p.read_text().replace("aliases: [", "aliases: [Blackwell, "))
    reg = YamlRegistry("hardware profile", d, lambda path, name: name, lambda path: path.stem)
    assert reg.load("DGX-B300") == "b300"
    with pytest.raises(InvalidConfigError, match="ambiguous.*b200 or b300"):
        reg.load("blackwell")


def test_aliases_must_be_a_list_of_names(tmp_path):
    data = yaml.safe_load((Path(PROFILE_DIR) / "b200.yaml").read_text())
    data["aliases"] = "B200"
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(HardwareProfileError, match="aliases must be a list"):
        load_hardware(str(p))


def test_exact_bundled_name_and_paths_win_over_the_loose_lookup(tmp_path, monkeypatch):
    # a file in the working directory named like a loose spelling is still a path when it has a suffix
    data = yaml.safe_load((Path(PROFILE_DIR) / "b200.yaml").read_text())
    data["name"] = "my-part"
    (tmp_path / "GB200.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert load_hardware("GB200.yaml").name == "my-part"
    assert load_hardware("GB200").name == "gb200-nvl72"


def test_a_bundled_name_loaded_once_is_served_without_touching_the_disk(tmp_path, monkeypatch):
    """validate loads a card and a profile per row: the second load of a bundled name is the cached parse, with no
    stat (the first still checks the file and its name)."""
    d = tmp_path / "profiles"
    _copy_dir(Path(PROFILE_DIR), d, ["b200"])
    reg = YamlRegistry("hardware profile", d, lambda path, name: [name], lambda path: [path.stem])
    first = reg.load("b200")
    calls = []
    monkeypatch.setattr("oracle.registry.os.path.exists", lambda p: calls.append(p) or True)
    assert reg.load("b200") is first and calls == []
    assert reg.bundled("b200") is first and reg.bundled("b300") is None
    with pytest.raises(InvalidConfigError, match="name is empty"):
        reg.load(" ")  # names never loaded are still checked
