"""``raytune-primus export`` output built into the frameworks' own config objects (not a mirror of them).

Megatron-LM: every flag goes through Megatron-LM's argument parser (an unknown flag, choice or type
fails), then its ``validate_args`` and the Megatron-Core config objects it builds from the arguments
(TransformerConfig / ModelParallelConfig, DistributedDataParallelConfig, OptimizerConfig); a name they
warn is deprecated fails too. TorchTitan:
the overrides go through ``ConfigManager.parse_args`` into ``Trainer.Config``. Primus: every override key
is a Megatron-LM argument or one of the Primus-only keys the export documents.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from oracle.config import RunConfig
from raytune_primus.export import PRIMUS_ONLY_KEYS, export_run
from tests.frameworks.frameworks import (build_megatron, build_torchtitan, capability, catalog,
                                         megatron_model_argv)

pytestmark = [pytest.mark.frameworks, pytest.mark.usefixtures("frameworks")]

CASES: dict[str, tuple[str, str, int, dict[str, Any]]] = {
    # id: (model, hardware, GPUs, training)
    "dense-fp8-delayed-vpp-tp-overlap": ("llama3.1-70b", "h100-sxm", 64, dict(
        seq_len=8192, gbs=128, tp=4, pp=4, vpp=5, precision="fp8", fp8_recipe="delayed", tp_comm_overlap=True)),
    "dense-bf16-no-sp-fp32-grads-no-overlap": ("llama3.1-8b", "h100-sxm", 16, dict(
        seq_len=8192, gbs=64, tp=2, sequence_parallel=False, grad_reduce_in_fp32=True,
        overlap_grad_reduce=False, overlap_param_gather=False, use_distributed_optimizer=False)),
    "dense-megatron-fsdp": ("llama3.1-8b", "h100-sxm", 16, dict(
        seq_len=8192, gbs=64, fsdp=True, use_distributed_optimizer=False)),
    "dense-nvfp4": ("llama3.1-8b", "b300", 8, dict(seq_len=8192, gbs=64, precision="nvfp4")),
    "dense-mxfp8-param-gather-cp": ("llama3.1-70b", "b200", 64, dict(
        seq_len=16384, gbs=64, tp=2, cp=2, pp=2, precision="fp8", fp8_recipe="mxfp8", fp8_param_gather=True)),
    "dense-tensorwise-full-recompute-block": ("llama3.1-70b", "h100-sxm", 64, dict(
        seq_len=8192, gbs=128, tp=4, pp=4, vpp=2, precision="fp8", fp8_recipe="tensorwise",
        recompute="full", recompute_num_layers=4)),
    "dense-unfused-attention": ("llama3.1-8b", "h100-sxm", 8, dict(
        seq_len=4096, gbs=32, tp=2, attention_backend="unfused", recompute="selective")),
    "dense-full-recompute-uniform": ("llama3.1-8b", "h100-sxm", 8, dict(
        seq_len=8192, gbs=32, tp=2, recompute="full")),
    "dense-local-cuda-graphs": ("llama3.1-8b", "b200", 8, dict(
        seq_len=8192, gbs=32, tp=1, cuda_graph_impl="local")),
    "dense-full-iteration-cuda-graphs": ("llama3.1-8b", "b200", 8, dict(
        seq_len=8192, gbs=32, tp=1, cuda_graph_impl="local", cuda_graph_scope=["full_iteration"])),
    "dense-uneven-first-last": ("llama3.1-70b", "h100-sxm", 64, dict(
        seq_len=8192, gbs=128, tp=8, pp=4, decoder_first_pipeline_num_layers=18,
        decoder_last_pipeline_num_layers=18)),
    "dense-embedding-loss-split": ("llama3.1-8b", "h100-sxm", 16, dict(
        seq_len=8192, gbs=64, tp=2, pp=2, account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True)),
    "moe-ep-etp-alltoall": ("mixtral-8x7b", "h100-sxm", 32, dict(
        seq_len=4096, gbs=128, tp=2, pp=2, ep=4, etp=2)),
    "moe-mxfp8-deepep-a2a-overlap-te-graphs": ("qwen3-30b-a3b", "b200", 16, dict(
        seq_len=4096, gbs=256, ep=8, precision="fp8", fp8_recipe="mxfp8", moe_a2a_backend="deepep",
        moe_a2a_overlap=True, cuda_graph_impl="transformer_engine",
        cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])),
    "moe-selective-recompute-modules": ("qwen3-30b-a3b", "h100-sxm", 16, dict(
        seq_len=4096, gbs=256, ep=8, recompute="selective", recompute_modules=["core_attn", "moe_act", "layernorm"])),
    "moe-token-drop-padded": ("qwen3-30b-a3b", "h100-sxm", 16, dict(
        seq_len=4096, gbs=256, ep=8, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)),
    "moe-megatron-fsdp-ep": ("qwen3-30b-a3b", "b200", 16, dict(
        seq_len=4096, gbs=256, ep=8, fsdp=True, use_distributed_optimizer=False, precision="fp8",
        fp8_recipe="mxfp8")),
    "moe-hybridep-static-paged-stash-fused-full-graph": ("qwen3-30b-a3b", "gb200-nvl72", 8, dict(
        seq_len=4096, gbs=512, mbs=4, ep=8, precision="fp8", fp8_recipe="mxfp8", fp8_param_gather=True,
        moe_a2a_backend="hybridep", moe_flex_dispatcher_num_sms=32, moe_expert_rank_capacity_factor=1.5,
        moe_paged_stash=True, moe_paged_stash_buffer_factor=1.2, fused_grouped_mlp=True, moe_a2a_overlap=True,
        moe_router_fusion=True, fp8_dot_product_attention=True, fp8_output_proj=True,
        cuda_graph_impl="full_iteration")),
    "moe-deepep-shared-expert-overlap-muon": ("deepseek-v3", "h100-sxm", 256, dict(
        seq_len=4096, gbs=2048, pp=8, vpp=2, ep=32, precision="fp8", fp8_recipe="blockwise",
        pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL", moe_a2a_backend="deepep",
        moe_shared_expert_overlap=True, optimizer="muon", muon_ns_steps=6, fp8_activations=True)),
    "moe-ulysses-cp-fine-grained-offload": ("gpt-oss-20b", "gb200-nvl72", 16, dict(
        seq_len=8192, gbs=64, cp=2, ep=4, cp_comm_type="a2a", offload_modules=["core_attn", "attn_proj", "moe_act"])),
    "dense-cpu-offload-megatron-fsdp": ("llama3.1-405b", "gb200-nvl72", 128, dict(
        seq_len=8192, gbs=64, tp=2, fsdp=True, use_megatron_fsdp=True, fsdp_double_buffer=True,
        precision="fp8", fp8_recipe="tensorwise", cpu_offloading=True, cpu_offloading_num_layers=95,
        gradient_accumulation_fusion=False)),
    "dense-first-last-bf16": ("llama3.1-8b", "b200", 8, dict(
        seq_len=8192, gbs=32, precision="fp8", fp8_recipe="mxfp8", first_last_layers_bf16=True,
        num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=2)),
    "hybrid-mamba-virtual-stages-graphs": ("nemotronh-8b", "h100-sxm", 16, dict(
        seq_len=8192, gbs=64, tp=2, pp=2, vpp=2, precision="fp8", fp8_recipe="tensorwise",
        pipeline_model_parallel_layout="E" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "L",
        cuda_graph_impl="transformer_engine", cuda_graph_scope=["mamba", "attn"])),
    "hybrid-moe-mamba-cp": ("nemotron3-nano-30b-a3b", "b200", 16, dict(
        seq_len=16384, gbs=64, tp=2, cp=2, ep=4, precision="fp8", fp8_recipe="mxfp8")),
    "mla-moe-layout-mtp": ("deepseek-v3", "b200", 256, dict(
        seq_len=4096, gbs=2048, pp=8, vpp=2, ep=32, precision="fp8", fp8_recipe="mxfp8",
        pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL", recompute="selective",
        recompute_modules=["mla_up_proj", "mlp"], mtp_use_repeated_layer=True)),
}


def run_of(case: str, **extra: Any) -> RunConfig:
    model, hardware, gpus, training = CASES[case]
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hardware, "num_gpus": gpus},
                                "training": {**training, **extra}})


def command_line(text: str) -> list[str]:
    """The arguments of an exported shell block (comment lines dropped, continuations joined)."""
    return shlex.split(" ".join(line.rstrip("\\ ") for line in text.splitlines() if line and not line.startswith("#")))


NO_TE = ["--no-rope-fusion"]
"""Transformer Engine's kernels are absent on this machine: what needs them at config time is off."""


def launch_env(run: RunConfig) -> dict[str, str]:
    """What Megatron-LM's validate_args asks of the launch environment: CUDA_DEVICE_MAX_CONNECTIONS=1 with
    TP or CP before Blackwell (one hardware queue keeps the TP/CP communication kernels ahead of the GEMMs
    they overlap), except under FSDP, which needs more than one queue."""
    t = run.training
    if (t.tp > 1 or t.cp > 1) and capability(run.cluster.hardware) < (10, 0) and not t.fsdp:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def exported_env(text: str) -> dict[str, str]:
    """The launch environment an export states (its ``#   export NAME=value`` lines)."""
    return dict(m.groups() for line in text.splitlines() if (m := re.match(r"#\s+export (\w+)=(\S+)$", line)))


def megatron_case(run: RunConfig) -> dict[str, Any]:
    text = export_run(run, "megatron")
    return {"argv": megatron_model_argv(run.model, run.training.seq_len) + NO_TE + command_line(text),
            "world_size": run.cluster.num_gpus, "capability": capability(run.cluster.hardware),
            "env": {**launch_env(run), **exported_env(text)}}


BAD_MEGATRON = {"unknown-flag": ["--no-such-flag"], "tp-overlap-without-sp": ["--tp-comm-overlap"],
                "deprecated-flag": ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"]}
"""Flags added to a passing case that Megatron-LM must refuse or warn are deprecated (the check can fail)."""


@pytest.fixture(scope="module")
def megatron_results() -> dict[str, str | None]:
    cases = {case: megatron_case(run_of(case)) for case in CASES}
    base = cases["dense-bf16-no-sp-fp32-grads-no-overlap"]  # TP 2 without SP
    cases.update({bad: {**base, "argv": base["argv"] + extra} for bad, extra in BAD_MEGATRON.items()})
    return dict(zip(cases, build_megatron(list(cases.values()))))


@pytest.mark.parametrize("case", list(CASES))
def test_megatron_export_builds_megatron_cores_configs(case, megatron_results):
    assert megatron_results[case] is None, f"{case}: {megatron_results[case]}\n{export_run(run_of(case), 'megatron')}"


def test_megatron_check_fails_on_an_unknown_flag_a_refused_combination_and_a_deprecated_name(megatron_results):
    """Megatron-LM's own parser and validate_args reject what they should."""
    assert "--no-such-flag" in (megatron_results["unknown-flag"] or "")
    assert "sequence parallelism" in (megatron_results["tp-overlap-without-sp"] or "")
    assert "--cuda-graph-scope is deprecated" in (megatron_results["deprecated-flag"] or "")


TORCHTITAN_MODEL = {"llama3": ("llama3", "llama3_8b"), "qwen3": ("qwen3", "qwen3_30b_a3b"),
                    "deepseek": ("deepseek_v3", "deepseek_v3_16b")}
"""Our model family -> the TorchTitan 0.3 --module / --config the overrides are applied to."""


def torchtitan_argv(run: RunConfig) -> list[str]:
    module, config = TORCHTITAN_MODEL.get(run.model.family, ("deepseek_v3", "deepseek_v3_16b") if run.model.is_moe
                                          else ("llama3", "llama3_8b"))
    return ["--module", module, "--config", config, *command_line(export_run(run, "torchtitan"))]


BAD_TORCHTITAN = ["--module", "llama3", "--config", "llama3_8b", "--parallelism.no_such_degree", "2"]


@pytest.fixture(scope="module")
def torchtitan_results() -> dict[str, str | None]:
    argv = {case: torchtitan_argv(run_of(case)) for case in CASES}
    argv.update({f"{case}/torchtitan-defaults": torchtitan_argv(run_of(
        case, framework="torchtitan", fsdp=True, use_distributed_optimizer=False, **extra))
        for case, extra in (("dense-full-recompute-uniform", {}),
                            ("moe-selective-recompute-modules", {"recompute_modules": None}))})
    argv["dense-compiled-async-tp"] = torchtitan_argv(RunConfig.from_dict({
        "model": "llama3.1-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
        "training": {"seq_len": 8192, "gbs": 64, "tp": 4, "framework": "torchtitan", "torch_compile": True,
                     "tp_comm_overlap": True}}))
    argv["unknown-key"] = BAD_TORCHTITAN
    return dict(zip(argv, build_torchtitan(list(argv.values()))))


def test_torchtitan_export_builds_trainer_config(torchtitan_results):
    failed = {case: err for case, err in torchtitan_results.items() if err is not None and case != "unknown-key"}
    assert not failed, failed


def test_torchtitan_check_fails_on_an_unknown_key(torchtitan_results):
    assert "no_such_degree" in (torchtitan_results["unknown-key"] or "")


PRIMUS_EXTRA = {"moe-zbv-deepep-sync-free": ("qwen3-30b-a3b", "mi355x", 32, dict(
    seq_len=4096, gbs=256, pp=2, vpp=2, ep=8, pp_schedule="zbv", moe_a2a_backend="deepep", moe_sync_free=True))}


@pytest.mark.parametrize("case", [*CASES, *PRIMUS_EXTRA])
def test_primus_keys_are_megatron_arguments_or_documented_primus_keys(case):
    model, hardware, gpus, training = {**CASES, **PRIMUS_EXTRA}[case]
    run = RunConfig.from_dict({"model": model, "cluster": {"hardware": hardware, "num_gpus": gpus},
                               "training": training})
    keys = set(yaml.safe_load(export_run(run, "primus"))["modules"]["pre_trainer"]["overrides"])
    unknown = keys - set(catalog()["megatron_lm_args"]) - set(PRIMUS_ONLY_KEYS)
    assert not unknown, f"{case}: {sorted(unknown)} are neither Megatron-LM arguments nor Primus keys"
