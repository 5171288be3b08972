"""benchmarks/bridge_recipes.py: every Megatron-Bridge performance recipe read from the installed package and
projected. A recipe whose model has a card and whose GPU has a profile is projected, unless Megatron-Core itself
would refuse the same settings (the refusals below are its own assertions)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = [pytest.mark.frameworks, pytest.mark.usefixtures("frameworks")]

from raytune_primus.bridge_recipes import read_recipes, recipe_mapping  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from bridge_recipes import project_recipe  # noqa: E402 - benchmarks/bridge_recipes.py, the sweep

MEGATRON_REFUSES = (
    "does not divide",  # parallel_state: world_size % (pp * ep * etp) (a 64-GPU recipe holding a 1,024-GPU layout)
    "is not divisible by mbs*dp",  # the global batch over the data-parallel ranks
    "virtual stages; pp*vpp",  # TransformerConfig: a layout whose stage count conflicts with the stated vpp
)


@pytest.fixture(scope="module")
def recipes() -> list[dict]:
    return read_recipes()


@pytest.fixture(scope="module")
def rows(recipes) -> list[dict]:
    return [project_recipe(r) for r in recipes]


def test_every_expressible_recipe_is_projected(rows):
    status = Counter(r["status"] for r in rows)
    assert status["projected"] >= 240, status
    refused = [r for r in rows if r["status"] == "refused"]
    assert all(any(m in r["why"] for m in MEGATRON_REFUSES) for r in refused), \
        [f"{r['recipe']}: {r['why']}" for r in refused if not any(m in r["why"] for m in MEGATRON_REFUSES)]
    # every family with a card is read and projected on every GPU with a profile
    families = {r["family"] for r in rows if r["status"] == "projected"}
    assert {"deepseek", "gpt_oss", "kimi", "llama", "nemotronh", "qwen"} <= families
    for r in rows:
        if r["status"] == "projected":
            assert r["tokens_per_s_per_gpu"] > 0 and 0 < r["mfu"] < 1 and r["peak_gib"] > 0
            # every setting a performance recipe carries is priced or ignored with its own reason
            assert not r["unknown_settings"], (r["recipe"], r["unknown_settings"])


def test_the_recipe_is_read_as_megatron_bridge_builds_it(recipes, rows):
    by = {r["recipe"]: r for r in rows}
    # Qwen3-Next on GB200: the layout counts its 48 transformer layers (the card writes 96 pattern symbols)
    assert by["qwen3_next_80b_a3b_pretrain_64gpu_gb200_bf16_config"]["layout"].startswith("tp1 pp2 vpp4")
    # apply_flex_dispatcher_backend: DeepEP runs on B200, falls back to alltoall on GB200
    recs = {r.get("function"): r for r in recipes}
    b200 = recipe_mapping(recs["qwen3_next_80b_a3b_pretrain_64gpu_b200_bf16_config"])
    assert b200["moe_token_dispatcher_type"] == "flex" and b200["moe_flex_dispatcher_backend"] == "deepep"
    # NVFP4 recipes train in NVFP4 (MixedPrecisionConfig.fp4 = e2m1)
    assert by["deepseek_v3_pretrain_256gpu_b200_nvfp4_config"]["precision"] == "nvfp4"
    assert by["deepseek_v3_pretrain_256gpu_b200_fp8cs_config"]["precision"] == "fp8/tensorwise"


def test_project_takes_a_performance_recipe_by_name(capsys):
    from raytune_primus.cli import main
    assert main(["project", "--bridge-recipe", "qwen3_next_80b_a3b_pretrain_64gpu_gb200_fp8mx_config",
                 "--format", "json", "--no-hints"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = out["config"]["training"]
    assert (t["pp"], t["vpp"], t["ep"], t["mbs"], t["gbs"], t["precision"]) == (2, 4, 32, 2, 1024, "fp8")
    assert out["config"]["cluster"]["num_gpus"] == 64 and out["tokens_per_s_per_gpu"] > 0
    # a --set overrides the recipe
    assert main(["project", "--bridge-recipe", "qwen3_next_80b_a3b_pretrain_64gpu_gb200_fp8mx_config",
                 "--set", "training.mbs=1", "--format", "json", "--no-hints"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["training"]["mbs"] == 1
    # a name that is not a recipe: the close ones; one with no card: which cards there are
    assert main(["project", "--bridge-recipe", "qwen3_next_80b_pretrain_64gpu_gb200_config"]) == 2
    assert "close: qwen3_next_80b_a3b_pretrain_64gpu_gb200" in capsys.readouterr().err
    assert main(["project", "--bridge-recipe", "nemotron_3_super_pretrain_64gpu_b200_bf16_config"]) == 2
    assert "no bundled card for nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16" in capsys.readouterr().err


def test_without_the_frameworks_the_error_says_how_to_install_them(tmp_path):
    env = {**os.environ, "RAYTUNE_PRIMUS_FRAMEWORKS": str(tmp_path / "none")}
    proc = subprocess.run([sys.executable, "-m", "raytune_primus.cli", "project", "--bridge-recipe", "x_config"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "install-frameworks.sh" in proc.stderr


def test_a_search_is_derived_from_a_recipes_run(capsys):
    from raytune_primus.cli import main
    assert main(["experiments", "init", "--bridge-recipe", "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config"]) == 0
    out = capsys.readouterr().out
    assert "--model qwen3-30b-a3b --hardware gb200-nvl72 --num-gpus 8 --seq-len 4096 --gbs 512 --precision fp8 " in out
    # the recipe's software settings are held; the layout axes are searched
    for held in ("--set moe_a2a_backend=hybridep", "--set fused_grouped_mlp=true",
                 "--set cuda_graph_impl=full_iteration", "--set moe_a2a_overlap=true", "--set fp8_recipe=mxfp8"):
        assert held in out
    assert "--set ep=" not in out and "--set mbs=" not in out
    # a --set of the user's outranks the recipe's
    assert main(["experiments", "init", "--bridge-recipe", "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config",
                 "--set", "cuda_graph_impl=none"]) == 0
    out = capsys.readouterr().out
    assert "--set cuda_graph_impl=none" in out and "cuda_graph_impl=full_iteration" not in out
    # --allow software: the recipe's software settings are searched too (its number format and static budget held)
    assert main(["experiments", "init", "--bridge-recipe", "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config",
                 "--allow", "software"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Derived by: raytune-primus experiments init --bridge-recipe "
                          "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config --allow software")
    spec = yaml.safe_load(out)
    assert spec["space"]["allow"] == ["software"]
    pinned = spec["space"]["pin"]
    assert pinned["fp8_recipe"] == "mxfp8" and pinned["moe_expert_rank_capacity_factor"] == 1.5
    for free, value in (("moe_a2a_backend", "hybridep"), ("fused_grouped_mlp", True),
                        ("cuda_graph_impl", "full_iteration"), ("moe_a2a_overlap", True)):
        assert free not in spec["space"]["pin"] and spec["baseline"][free] == value, free  # the walk starts there
    assert "delay_wgrad_compute" not in spec["space"]["pin"]  # follows moe_a2a_overlap
    assert main(["experiments", "init", "--bridge-recipe", "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config",
                 "--gbs", "256"]) == 2
    assert "give it without --gbs" in capsys.readouterr().err
    assert main(["experiments", "init", "--bridge-recipe", "gpt_oss_20b_pretrain_8gpu_b300_fp8mx_config"]) == 2
    assert "changes the model card" in capsys.readouterr().err
