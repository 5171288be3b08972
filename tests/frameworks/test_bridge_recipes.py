"""benchmarks/bridge_recipes.py: every Megatron-Bridge performance recipe read from the installed package and
projected. A recipe whose model has a card and whose GPU has a profile is projected, unless Megatron-Core itself
would refuse the same settings (the refusals below are its own assertions)."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.frameworks, pytest.mark.usefixtures("frameworks")]

sys.path.insert(0, str(ROOT / "benchmarks"))
import bridge_recipes  # noqa: E402

MEGATRON_REFUSES = (
    "does not divide",  # parallel_state: world_size % (pp * ep * etp) (a 64-GPU recipe holding a 1,024-GPU layout)
    "is not divisible by mbs*dp",  # the global batch over the data-parallel ranks
    "virtual stages; pp*vpp",  # TransformerConfig: a layout whose stage count conflicts with the stated vpp
)


@pytest.fixture(scope="module")
def recipes() -> list[dict]:
    return bridge_recipes.read_recipes()


@pytest.fixture(scope="module")
def rows(recipes) -> list[dict]:
    return [bridge_recipes.project_recipe(r) for r in recipes]


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
    b200 = bridge_recipes.recipe_mapping(recs["qwen3_next_80b_a3b_pretrain_64gpu_b200_bf16_config"])
    assert b200["moe_token_dispatcher_type"] == "flex" and b200["moe_flex_dispatcher_backend"] == "deepep"
    # NVFP4 recipes train in NVFP4 (MixedPrecisionConfig.fp4 = e2m1)
    assert by["deepseek_v3_pretrain_256gpu_b200_nvfp4_config"]["precision"] == "nvfp4"
    assert by["deepseek_v3_pretrain_256gpu_b200_fp8cs_config"]["precision"] == "fp8/tensorwise"
