"""Every name in the published recipes (``recipe`` column of published-nvidia.csv) is one the frameworks know.

The names are Megatron-Core / Megatron-Bridge argument names (``../shared/validation/recipes.md``); each must
be a field of a Megatron-Core or Megatron-Bridge config dataclass, a field of a Megatron-Bridge
ConfigContainer section (``ddp.*``, ``comm_overlap.*``), a Megatron-LM flag, or a recipe environment
variable (``env.*``, ConfigContainer.env_vars). Shorthands stand for the names in RECIPE_SHORTHANDS.
"""
from __future__ import annotations

import csv

import pytest

from tests.conftest import SHARED
from tests.frameworks.frameworks import check_names

pytestmark = [pytest.mark.frameworks, pytest.mark.usefixtures("frameworks")]

NVIDIA_CSV = SHARED / "validation" / "published-nvidia.csv"

RECIPE_SHORTHANDS: dict[str, str | tuple[str, ...]] = {
    # recipes.md: "moe_a2a_overlap = comm_overlap.overlap_moe_expert_parallel_comm"
    "moe_a2a_overlap": "comm_overlap.overlap_moe_expert_parallel_comm",
    # Megatron-Bridge CommOverlapConfig.defer_embedding_wgrad_compute (Megatron-Core ModelParallelConfig field
    # of the same name); the recipe column drops the _compute
    "defer_embedding_wgrad": "comm_overlap.defer_embedding_wgrad_compute",
    # 26.06's scripts/performance WorkloadBaseConfig (not in the megatron-bridge wheel); in 0.6 the same
    # settings are MixedPrecisionConfig.fp8_dot_product_attention and the recipe's env_vars
    # NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (perf_recipes/qwen/*/qwen3_moe.py)
    "workload_base_config.fp8_dot_product_attention": "mixed_precision.fp8_dot_product_attention",
    "workload_base_config.cutedsl_fused_grouped_mlp": "env.NVTE_CUTEDSL_FUSED_GROUPED_MLP",
}
"""Names in the recipe column that are not the frameworks' own, and what they stand for (the lead's
oracle/recipe.py mapping is the one to use once it exists)."""


def recipe_pairs(cell: str) -> list[tuple[str, str]]:
    """``key=value;...`` of one recipe cell; a ``(...)`` element is a note, not a setting."""
    pairs = []
    for item in filter(None, (p.strip() for p in cell.split(";"))):
        if item.startswith("("):
            continue
        key, sep, value = item.partition("=")
        assert sep, f"recipe element {item!r} is not key=value"
        pairs.append((key, value))
    return pairs


@pytest.fixture(scope="module")
def recipe_keys() -> dict[str, set[str]]:
    if not NVIDIA_CSV.exists():
        pytest.skip(f"{NVIDIA_CSV} is not here")
    keys: dict[str, set[str]] = {}
    with NVIDIA_CSV.open() as f:
        for row in csv.DictReader(f):
            for key, value in recipe_pairs(row.get("recipe") or ""):
                keys.setdefault(key, set()).add(value)
    return keys


def test_every_published_recipe_name_is_known_to_the_frameworks(recipe_keys):
    assert len(recipe_keys) > 50  # the column is read
    report = check_names(recipe_keys, aliases=RECIPE_SHORTHANDS)
    assert not report.unknown, f"names no framework knows: {sorted(report.unknown)}"
    assert not report.bad_values, f"values Megatron-LM refuses: {report.bad_values}"
    # the settings issue 25 prices resolve to the classes that hold them
    assert any("CommOverlapConfig.overlap_moe_expert_parallel_comm" in w for w in report.known["moe_a2a_overlap"])
    assert any("TransformerConfig.cuda_graph_impl" in w for w in report.known["cuda_graph_impl"])
    assert "--moe-flex-dispatcher-backend" in report.known["moe_flex_dispatcher_backend"]
    assert report.known["ddp.data_parallel_sharding_strategy"] == (
        "megatron.bridge.training.config.DistributedDataParallelConfig.data_parallel_sharding_strategy",
        "--data-parallel-sharding-strategy")


def test_check_names_reports_what_no_framework_knows():
    report = check_names(["fp8_format", "env.NVLINK_DOMAIN_SIZE", "moe_a2a_overlap", "comm_overlap.no_such_flag",
                          "ddp.fp8_recipe", "no_such_setting", "a.b.c"])
    assert report.unknown == ("moe_a2a_overlap", "comm_overlap.no_such_flag", "ddp.fp8_recipe", "no_such_setting",
                              "a.b.c")
    assert "--fp8-format (argparse dest fp8)" in report.known["fp8_format"]
    assert report.known["env.NVLINK_DOMAIN_SIZE"][0].endswith("ConfigContainer.env_vars[NVLINK_DOMAIN_SIZE]")
    both = check_names(["moe_a2a_overlap"], aliases={"moe_a2a_overlap": ("overlap_moe_expert_parallel_comm",
                                                                         "delay_wgrad_compute")})
    assert both.aliased["moe_a2a_overlap"] == ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")
    assert not check_names(["x"], aliases={"x": ("delay_wgrad_compute", "no_such_setting")}).known
    values = check_names({"cuda_graph_impl": "full_iteration", "fp8_format": {"e4m3", "e5m2"}})
    assert values.bad_values == {"fp8_format": ("e5m2", ("e4m3", "hybrid"))}


OUR_SHORTHANDS = {"tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "gbs", "seq_len", "loss_fusion",
                  "moe_paged_stash_buffer_factor", *RECIPE_SHORTHANDS, "cutedsl_fused_grouped_mlp"}
"""Names oracle.recipe reads that are this project's (training keys) or the recipe column's shorthands."""


def test_every_setting_oracle_recipe_reads_is_a_framework_name_or_a_listed_shorthand():
    """A setting added to the recipe table under a misspelt or invented name would never match a real recipe."""
    from oracle.recipe import SETTINGS
    report = check_names(sorted(SETTINGS))
    assert set(report.unknown) <= OUR_SHORTHANDS, sorted(set(report.unknown) - OUR_SHORTHANDS)
    for name in ("attention_backend", "muon_split_qkv", "muon_tp_mode", "optimizer"):
        assert report.known[name], name
