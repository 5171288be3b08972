"""``raytune-primus export CONFIG --to megatron|primus|torchtitan``: a configuration in a framework's words.

CONFIG is a config YAML (sections model, cluster, training) or a results directory of ``tune`` /
``compare`` (its winner, or the exhaustive optimum). Every training key is accounted for: it is
written as the target's option, or listed in a comment block as not supported by the target, or as a
projection-only assumption (a fact the oracle needs that no framework takes as an option, e.g. the
MoE load imbalance). Nothing is dropped silently; a key added to ``TrainingConfig`` later and not
mapped here is listed as not exported.

* ``megatron``: Megatron-LM ``pretrain_gpt.py`` arguments, one per line (a ``\\``-continued shell block).
* ``primus``: a Primus experiment YAML override block (``modules.pre_trainer.overrides``, Megatron-LM
  argument names as argparse stores them, e.g. ``fp8`` for ``--fp8-format``, plus the Primus-Turbo and
  zero-bubble keys Primus adds: PRIMUS_ONLY_KEYS).
* ``torchtitan``: TorchTitan 0.3 command-line overrides of ``Trainer.Config`` (``--parallelism.*``,
  ``--training.*``, ``--compile.*``, the ``activation_checkpoint:<mode>`` subcommand) to append to
  ``torchtitan.train --module MODEL --config CONFIG_FUNCTION``; TorchTitan 0.3 reads no TOML job file.

Model architecture flags (layers, hidden size, ...) come from the model's own recipe in each
framework and are not written; the header names the model and the cluster.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.recipe import RECIPE_TRAINING_KEYS, megatron_cli_args

TARGETS: tuple[str, ...] = ("megatron", "primus", "torchtitan")
PROJECTION_ONLY = {
    "moe_imbalance": "a load assumption of the projection (paper Sec. 4.10), not a training option",
    "pipeline_split": "how the projection spread layers over stages; exported as the layout flags it implies",
    "moe_paged_stash_buffer_factor": "sizes the paged stash's device buffer (exported with moe_paged_stash)",
}
"""Keys that describe the projection's assumptions rather than a framework option."""
PRIMUS_ONLY_KEYS: tuple[str, ...] = ("patch_zero_bubble", "enable_zero_bubble", "zero_bubble_v_schedule",
                                     "zero_bubble_v_schedule_mem_setup", "use_turbo_deepep", "turbo_sync_free_moe_stage")
"""The ``primus`` keys that are not Megatron-LM arguments: the zero-bubble scheduler Primus vendors and
Primus-Turbo's DeepEP and sync-free MoE."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """A configuration mapped onto one framework."""

    target: str
    options: list[tuple[str, Any]] = field(default_factory=list)
    """(option name in the target's spelling, value); True = a bare flag / true."""
    unsupported: list[tuple[str, Any, str]] = field(default_factory=list)
    """(training key, value, why) the target cannot express."""
    projection_only: list[tuple[str, Any, str]] = field(default_factory=list)
    """(training key, value, why) that are assumptions of the projection, not options."""
    environment: list[tuple[str, Any]] = field(default_factory=list)
    """(variable, value) the launch environment must set (Megatron-Core reads a few switches from it)."""


def _layers_per_virtual_stage(run: RunConfig) -> int | None:
    t = run.training
    n = run.model.num_layers
    return n // (t.pp * t.vpp) if n % (t.pp * t.vpp) == 0 else None


def _layout(run: RunConfig) -> dict[str, Any]:
    """Uneven-pipeline keys in effect, read with defaults so older and newer TrainingConfigs both work."""
    t = run.training
    out: dict[str, Any] = {}
    first = getattr(t, "decoder_first_pipeline_num_layers", None) or getattr(t, "first_stage_layers", None)
    last = getattr(t, "decoder_last_pipeline_num_layers", None) or getattr(t, "last_stage_layers", None)
    if first is not None:
        out["decoder_first_pipeline_num_layers"] = first
    if last is not None:
        out["decoder_last_pipeline_num_layers"] = last
    if getattr(t, "pipeline_model_parallel_layout", None):
        out["pipeline_model_parallel_layout"] = t.pipeline_model_parallel_layout
    emb = getattr(t, "account_for_embedding_in_pipeline_split", False)
    loss = getattr(t, "account_for_loss_in_pipeline_split", False)
    split = getattr(t, "pipeline_split", None)  # older configs: auto | even | embedding_loss
    if split == "embedding_loss" or (split == "auto" and t.pp > 1 and not first and not last
                                     and run.model.num_layers % (t.pp * t.vpp) != 0):
        emb = loss = True  # what 'auto' resolved to when the even split did not divide
    if emb:
        out["account_for_embedding_in_pipeline_split"] = True
    if loss:
        out["account_for_loss_in_pipeline_split"] = True
    return out


LAYOUT_KEYS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "first_stage_layers",
               "last_stage_layers", "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "pipeline_split")


def _hybrid_pattern_with_stages(run: RunConfig) -> str:
    """A hybrid model's layer pattern with a '|' at every virtual-stage boundary of ``run``'s layout (Megatron-Core
    select_pipeline_segment reads its stages, and the virtual stages, from them)."""
    from oracle.layout import Layout
    pattern = run.model.hybrid_pattern or ""
    return "|".join("".join(pattern[i] for i in st.layers) for st in Layout(run).assignment.stages)


def _recompute(run: RunConfig) -> tuple[list[tuple[str, Any]], str | None]:
    """Megatron recompute options (names with underscores) and a problem, if the value has no exact form."""
    t = run.training
    if t.recompute == "none":
        return [], None
    if t.recompute == "selective":
        mods = [("recompute_modules", list(t.recompute_modules))] if t.recompute_modules is not None else []
        return [("recompute_granularity", "selective"), *mods], None
    if t.recompute_num_layers is None:  # every layer: uniform method, one layer per group
        return [("recompute_granularity", "full"), ("recompute_method", "uniform"), ("recompute_num_layers", 1)], None
    # ours: layers per pipeline rank, spread over its vpp chunks; Megatron's block method counts per chunk
    if t.recompute_num_layers % t.vpp:
        return ([("recompute_granularity", "full"), ("recompute_method", "block"),
                 ("recompute_num_layers", -(-t.recompute_num_layers // t.vpp))],
                f"recompute_num_layers={t.recompute_num_layers} per rank is not a multiple of vpp={t.vpp}; "
                f"rounded up per chunk")
    return [("recompute_granularity", "full"), ("recompute_method", "block"),
            ("recompute_num_layers", t.recompute_num_layers // t.vpp)], None


def _megatron_options(run: RunConfig, *, primus: bool) -> Export:
    """Megatron-LM argument names as argparse stores them (the Primus YAML keys); the command line spells
    them MEGATRON_FLAGS[name] or ``--`` + the dashed name."""
    t = run.training
    target = "primus" if primus else "megatron"
    ex = Export(target=target)
    opt, unsup = ex.options, ex.unsupported
    done: set[str] = set()

    def put(name: str, value: Any, *keys: str) -> None:
        opt.append((name, value))
        done.update(keys)

    put("tensor_model_parallel_size", t.tp, "tp")
    put("pipeline_model_parallel_size", t.pp, "pp")
    schedule = t.schedule
    done.add("pp_schedule")
    hybrid_stages = run.model.is_hybrid and bool(getattr(t, "pipeline_model_parallel_layout", None))
    if hybrid_stages:
        # Megatron-LM refuses --pipeline-model-parallel-layout and --num-virtual-stages-per-pipeline-rank with
        # --hybrid-layer-pattern: a hybrid model's stage boundaries are '|' in its pattern (validate_args)
        put("hybrid_layer_pattern", _hybrid_pattern_with_stages(run), "vpp")
    elif t.vpp > 1 and not getattr(t, "pipeline_model_parallel_layout", None):  # a layout states its stages
        n = _layers_per_virtual_stage(run)
        if n is not None and not _layout(run):
            put("num_layers_per_virtual_pipeline_stage", n, "vpp")
        else:
            put("num_virtual_stages_per_pipeline_rank", t.vpp, "vpp")
    else:
        done.add("vpp")
    if schedule in ("zero_bubble", "zbv", "v_half", "v_min", "zbv_greedy"):
        if primus:  # Primus vendors the Sea AI Lab zero-bubble scheduler
            put("patch_zero_bubble", True)
            put("enable_zero_bubble", True)
            if schedule != "zero_bubble":
                put("zero_bubble_v_schedule", True)
                put("zero_bubble_v_schedule_mem_setup",
                    {"zbv": "zb", "zbv_greedy": "zb", "v_half": "half", "v_min": "min"}[schedule])
        else:
            unsup.append(("pp_schedule", schedule, "upstream Megatron-LM has 1F1B and interleaved 1F1B only "
                                                   "(Primus and the zero-bubble fork add ZB/ZBV)"))
    elif schedule == "ilp":
        unsup.append(("pp_schedule", schedule, "an ILP-solved order is this project's schedule, no framework runs it"))
    put("context_parallel_size", t.cp, "cp")
    put("expert_model_parallel_size", t.ep, "ep")
    put("expert_tensor_parallel_size", t.etp, "etp")
    done.update(("sequence_parallel", "tp_comm_overlap"))
    if t.sp:
        put("sequence_parallel", True)
    elif primus:
        put("sequence_parallel", False)
    put("micro_batch_size", t.mbs, "mbs")
    put("global_batch_size", t.gbs, "gbs")
    put("seq_length", t.seq_len, "seq_len")
    rec, problem = _recompute(run)
    for k, v in rec:
        put(k, v)
    done.update(("recompute", "recompute_num_layers", "recompute_modules"))
    if problem:
        unsup.append(("recompute_num_layers", t.recompute_num_layers, problem))
    done.update(("precision", "fp8_recipe"))
    if t.precision == "bf16":
        put("bf16", True)
    elif t.precision == "fp8":
        put("bf16", True)
        put("fp8", "e4m3" if t.fp8_recipe == "mxfp8" else "hybrid")  # --fp8-format; MXFP8: E4M3 throughout (TE)
        put("fp8_recipe", t.fp8_recipe)
    elif t.precision == "nvfp4":
        put("bf16", True)
        put("fp4", "e2m1")  # --fp4-format
        put("fp4_recipe", "nvfp4")
    else:
        unsup.append(("precision", t.precision, "no known Megatron-LM flag"))
    for key in ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
        if getattr(t, key) or primus:
            put(key, bool(getattr(t, key)), key)
        done.add(key)
    done.add("fsdp")
    if t.fsdp:  # Megatron-FSDP (what the Megatron-Bridge recipes run): ZeRO-3 over the data-parallel group;
        # it brings its own distributed optimizer and checkpoints only as fsdp_dtensor (validate_args)
        put("use_megatron_fsdp", True)
        put("data_parallel_sharding_strategy", "optim_grads_params")
        put("ckpt_format", "fsdp_dtensor")
    done.add("grad_reduce_in_fp32")
    if not t.grad_reduce_in_fp32:
        put("grad_reduce_in_bf16", True)
    done.add("fp8_param_gather")
    if t.fp8_param_gather:
        put("fp8_param_gather", True)
    if t.tp_overlap:
        put("tp_comm_overlap", True)
    elif primus:
        put("tp_comm_overlap", False)
    done.update(("moe_a2a_backend", "moe_sync_free"))
    if run.model.is_moe:
        put("moe_grouped_gemm", True)  # the experts as Transformer Engine grouped GEMMs (TEGroupedMLP), as priced
        if t.moe_a2a_backend == "alltoall":
            put("moe_token_dispatcher_type", "alltoall")
        elif t.moe_a2a_backend == "deepep" and primus:  # the flex dispatcher itself: oracle.recipe below
            put("use_turbo_deepep", True)
        if t.moe_sync_free:
            if primus:
                put("turbo_sync_free_moe_stage", 2)  # Primus-Turbo sync-free MoE (stage >= 2 needs DeepEP)
            else:
                unsup.append(("moe_sync_free", True, "sync-free MoE is Primus-Turbo's, not upstream Megatron-LM's"))
    done.update(("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"))
    if t.moe_expert_capacity_factor is not None:  # token-drop MoE (Megatron-Core's alltoall dispatcher)
        put("moe_expert_capacity_factor", t.moe_expert_capacity_factor)
        if t.moe_pad_expert_input_to_capacity:
            put("moe_pad_expert_input_to_capacity", True)
    # the recipe settings (flex dispatcher, all-to-all overlap, fusions, FP8 attention, offloading, optimizer,
    # ...): oracle.recipe's one mapping, the inverse of what validate and --megatron-args read
    cli, config_only = megatron_cli_args(t)
    for name, value in cli:
        if name.startswith("env."):
            ex.environment.append((name[4:], value))
        else:
            put(name, value)
    unsup += [(name, value, f"{why}: set it in the framework's model config") for name, value, why in config_only]
    done.update(RECIPE_TRAINING_KEYS)
    done.update(("cuda_graph_impl", "cuda_graph_scope"))
    if t.cuda_graph_impl == "full_iteration" or "full_iteration" in t.cuda_graph_scope:
        # Megatron-Core 0.19: an impl of its own, without the NaN check
        put("cuda_graph_impl", "full_iteration")
        put("check_for_nan_in_loss_and_grad", False)
    elif t.cuda_graph_impl != "none":  # --cuda-graph-impl / --cuda-graph-modules (was --cuda-graph-scope);
        put("cuda_graph_impl", t.cuda_graph_impl)  # no modules: the whole layer
        if t.cuda_graph_scope:
            put("cuda_graph_modules", list(t.cuda_graph_scope))
    done.add("loss_fusion")
    if t.loss_fusion:
        put("cross_entropy_loss_fusion", True)
    elif primus:
        put("cross_entropy_loss_fusion", False)
    for k, v in _layout(run).items():
        if not (hybrid_stages and k == "pipeline_model_parallel_layout"):
            put(k, v)
    done.update(LAYOUT_KEYS)
    done.update(("framework", "torch_compile"))
    if t.framework != "megatron":
        unsup.append(("framework", t.framework, f"the projection priced {t.framework}'s kernels; Megatron-LM runs "
                                                "Transformer Engine's (re-project with framework=megatron)"))
    _rest(run, ex, done)
    return ex


TORCHTITAN_CONVERTER = {"delayed": "Float8LinearConverter", "tensorwise": "Float8LinearConverter",
                        "blockwise": "Float8LinearConverter", "mxfp8": "MXFP8LinearConverter"}
"""TorchTitan 0.3's model converter (torchtitan/components/quantization) for each FP8 recipe."""


def _torchtitan(run: RunConfig) -> Export:
    """TorchTitan 0.3 ``Trainer.Config`` overrides (``--section.key``, torchtitan/config/manager.py)."""
    t = run.training
    ex = Export(target="torchtitan")
    opt, unsup = ex.options, ex.unsupported
    done: set[str] = set()
    dp = run.cluster.num_gpus // (t.tp * t.pp * t.cp)
    opt.append(("parallelism.data_parallel_replicate_degree", 1 if t.fsdp else dp))
    opt.append(("parallelism.data_parallel_shard_degree", dp if t.fsdp else 1))
    done.add("fsdp")
    if not t.fsdp and t.use_distributed_optimizer and dp > 1:
        unsup.append(("use_distributed_optimizer", True, "no ZeRO-1 in TorchTitan: it replicates (DDP) or shards "
                                                         "everything (FSDP2, set data_parallel_shard_degree)"))
    elif t.fsdp and not t.use_distributed_optimizer:
        unsup.append(("use_distributed_optimizer", False, "TorchTitan's FSDP2 shards the optimizer state anyway"))
    done.add("use_distributed_optimizer")
    done.add("fp8_param_gather")
    if t.fp8_param_gather:
        unsup.append(("fp8_param_gather", True, "TorchTitan gathers FP8 weights only under FSDP2 "
                                                "(float8 enable_fsdp_float8_all_gather), not with a replicated DP"))
    opt.append(("parallelism.tensor_parallel_degree", t.tp))
    opt.append(("parallelism.pipeline_parallel_degree", t.pp))
    opt.append(("parallelism.context_parallel_degree", t.cp))
    opt.append(("parallelism.expert_parallel_degree", t.ep))
    if t.etp != 1:
        unsup.append(("etp", t.etp, "TorchTitan 0.3 has no expert tensor parallelism: the experts shard over EP "
                                    "and FSDP (efsdp = dp_shard*cp*tp/ep)"))
    done.update(("tp", "pp", "cp", "ep", "etp", "vpp", "pp_schedule"))
    if t.pp > 1:
        name = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble"}.get(t.schedule)
        if t.schedule == "zero_bubble" and t.vpp > 1:
            name = "InterleavedZeroBubble"
        if name is None:
            unsup.append(("pp_schedule", t.schedule, "TorchTitan schedules: 1F1B, Interleaved1F1B, "
                                                     "InterleavedZeroBubble (vpp > 1), ZBVZeroBubble, GPipe"))
        else:
            opt.append(("parallelism.pipeline_parallel_schedule", name))
        opt.append(("parallelism.pipeline_parallel_microbatch_size", t.mbs))
        n = _layers_per_virtual_stage(run)
        if t.vpp > 1 and n is not None:
            opt.append(("parallelism.pipeline_parallel_layers_per_stage", n))
        elif t.vpp > 1:
            unsup.append(("vpp", t.vpp, f"{run.model.num_layers} layers do not split evenly into pp*vpp = "
                                        f"{t.pp * t.vpp} stages; set module_fqns_per_model_part by hand"))
    layout = _layout(run)
    if layout:
        for k, v in layout.items():
            unsup.append((k, v, "TorchTitan splits layers by pipeline_parallel_layers_per_stage / "
                                "module_fqns_per_model_part; give the split by hand"))
    done.update(LAYOUT_KEYS)
    done.update(("sequence_parallel", "tp_comm_overlap"))
    if t.tp > 1 and not t.sp:
        opt.append(("parallelism.enable_sequence_parallel", False))
    if t.tp_overlap and t.torch_compile:  # async TP is an Inductor pass: compile.enable with the model
        opt.append(("compile.enable_async_tensor_parallel", True))
    elif t.tp_overlap:
        unsup.append(("tp_comm_overlap", True, "TorchTitan's async TP runs only under torch.compile "
                                               "(compile.enable_async_tensor_parallel); re-project with torch_compile"))
    # local_batch_size is per data-parallel rank and step: with a pipeline the whole per-rank batch, cut
    # into pipeline_parallel_microbatch_size; without one, the micro-batch, and global_batch_size /
    # (local x dp) steps are accumulated
    opt.append(("training.local_batch_size", t.gbs // dp if t.pp > 1 else t.mbs))
    opt.append(("training.global_batch_size", t.gbs))
    opt.append(("training.seq_len", t.seq_len))
    done.update(("mbs", "gbs", "seq_len"))
    done.update(("recompute", "recompute_num_layers", "recompute_modules"))
    if t.recompute_modules is not None:
        unsup.append(("recompute_modules", list(t.recompute_modules), "TorchTitan's selective checkpointing is "
                                                                      "per op, not per Megatron module"))
    if t.recompute == "full" and t.recompute_num_layers is not None:
        unsup.append(("recompute_num_layers", t.recompute_num_layers, "TorchTitan 0.3 checkpoints every layer "
                                                                      "(activation_checkpoint:full)"))
    done.update(("precision", "fp8_recipe"))
    opt.append(("training.mixed_precision_param", "bfloat16"))
    if t.precision == "fp8":
        unsup.append(("precision", t.precision, f"TorchTitan 0.3 quantizes in the model's config function (model "
                                                f"converters, no command-line key): for fp8_recipe={t.fp8_recipe} "
                                                f"choose a --config with {TORCHTITAN_CONVERTER[t.fp8_recipe]}"))
    elif t.precision == "nvfp4":
        unsup.append(("precision", t.precision, "TorchTitan 0.3 quantizes in the model's config function (model "
                                                "converters, no command-line key): choose a --config with "
                                                "NVFP4LinearConverter"))
    done.add("grad_reduce_in_fp32")
    if t.grad_reduce_in_fp32:
        opt.append(("training.mixed_precision_reduce", "float32"))
    else:
        unsup.append(("grad_reduce_in_fp32", False, "TorchTitan reduces gradients in float32 only "
                                                    "(training.mixed_precision_reduce)"))
    done.update(("overlap_grad_reduce", "overlap_param_gather"))
    for key in ("overlap_grad_reduce", "overlap_param_gather"):
        if not getattr(t, key):
            unsup.append((key, False, "FSDP2/DDP in TorchTitan always overlap; it cannot be turned off"))
    done.update(("moe_a2a_backend", "moe_sync_free", "loss_fusion"))
    if run.model.is_moe and t.moe_a2a_backend in ("deepep", "hybridep"):
        unsup.append(("moe_a2a_backend", t.moe_a2a_backend,
                      f"TorchTitan 0.3 picks the token dispatcher in the model's config function (moe_comm_backend="
                      f"'{t.moe_a2a_backend}', e.g. --config qwen3_moe_deepep), no command-line key"))
    if run.model.is_moe and t.moe_sync_free:
        unsup.append(("moe_sync_free", True, "sync-free MoE is Primus-Turbo's"))
    done.add("moe_a2a_overlap")
    if t.moe_a2a_overlap:
        unsup.append(("moe_a2a_overlap", True, "TorchTitan has no merged forward/backward all-to-all overlap"))
    done.update(("optimizer", "muon_ns_steps"))
    if t.optimizer == "muon":
        unsup.append(("optimizer", "muon", "TorchTitan 0.3 sets optimizers per parameter group in the config function "
                                           "(optimizer.param_groups: optimizer_name='DistMuon' for the 2-D weights, "
                                           "AdamW for the rest), no command-line key"))
    done.update(("cuda_graph_impl", "cuda_graph_scope"))
    if "full_iteration" in t.cuda_graph_scope and t.pp == 1:
        pass  # TorchTitan 0.3 captures the whole forward+backward step by default
    elif "full_iteration" in t.cuda_graph_scope:
        unsup.append(("cuda_graph_scope", ["full_iteration"], "TorchTitan 0.3 captures the step only without "
                                                              "pipeline parallelism"))
    else:
        opt.append(("training.disable_cuda_graphs", True))  # on by default in TorchTitan 0.3
        if t.cuda_graph_impl != "none":
            unsup.append(("cuda_graph_impl", t.cuda_graph_impl, "TorchTitan 0.3 captures the whole forward+backward "
                                                                "step or nothing; per-layer graphs are Megatron's"))
    if not t.loss_fusion and t.framework != "torchtitan":
        unsup.append(("loss_fusion", False, "TorchTitan has no switch for it"))
    done.update(("framework", "torch_compile"))
    if t.torch_compile:
        opt.append(("compile.enable", True))
    if run.model.is_hybrid:
        mixer = run.model.mixer_name or "Mamba"
        unsup.append(("model", run.model.name, f"a hybrid {mixer} model: TorchTitan 0.3 has no {mixer} layer "
                                               f"(Megatron-Core HybridModel runs it)"))
    elif t.framework != "torchtitan":
        unsup.append(("framework", t.framework, "the projection priced Megatron/Transformer Engine kernels; "
                                                "re-project with framework=torchtitan for TorchTitan's"))
    opt.append(("activation_checkpoint", t.recompute))  # a subcommand: activation_checkpoint:<mode>, last
    _rest(run, ex, done)
    return ex


def _rest(run: RunConfig, ex: Export, done: set[str]) -> None:
    """List every training key not mapped above and not at its default: projection-only, or not
    exported (never dropped)."""
    for f in dataclasses.fields(run.training):
        if f.name in done:
            continue
        value = getattr(run.training, f.name)
        if value == f.default:  # a default changes nothing in any framework
            continue
        if f.name in PROJECTION_ONLY:
            ex.projection_only.append((f.name, value, PROJECTION_ONLY[f.name]))
        else:
            ex.unsupported.append((f.name, value, f"no {ex.target} option is mapped for this key"))


def build_export(run: RunConfig, target: str) -> Export:
    """``run``'s training configuration in ``target``'s options (see the module doc)."""
    if target == "megatron":
        return _megatron_options(run, primus=False)
    if target == "primus":
        return _megatron_options(run, primus=True)
    if target == "torchtitan":
        return _torchtitan(run)
    raise InvalidConfigError(f"--to {target!r} is not one of {' | '.join(TARGETS)}")


# ------------------------------------------------------------------------------------------ rendering
def _header(run: RunConfig, ex: Export) -> list[str]:
    c = run.cluster
    nodes = c.num_gpus / c.hardware.gpus_per_node
    lines = [f"# {run.model_ref or run.model.name} on {c.num_gpus} x {run.hardware_ref or c.hardware.name} "
             f"({nodes:g} node{'' if nodes == 1 else 's'} of {c.hardware.gpus_per_node}); config {run.key()} "
             f"(raytune-primus export)",
             "# model architecture options come from the model's recipe in the framework"]
    if ex.unsupported:
        lines.append(f"# not supported by {ex.target}:")
        lines += [f"#   {k}={_plain(v)}: {why}" for k, v, why in ex.unsupported]
    if ex.projection_only:
        lines.append("# projection-only assumptions (no framework option):")
        lines += [f"#   {k}={_plain(v)}: {why}" for k, v, why in ex.projection_only]
    if ex.environment:
        lines.append("# launch environment:")
        lines += [f"#   export {k}={v}" for k, v in ex.environment]
    return lines


def _plain(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (bool, list)) or v is None else str(v)


MEGATRON_FLAGS: dict[str, str] = {"fp8": "--fp8-format", "fp4": "--fp4-format"}
"""Megatron-LM arguments whose flag is not ``--`` + the dashed argument name (megatron/training/arguments.py)."""
MEGATRON_OFF_FLAGS: dict[str, str] = {"check_for_nan_in_loss_and_grad": "--no-check-for-nan-in-loss-and-grad",
                                      "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion"}
"""Megatron-LM arguments that are on by default, and the flag that turns each off."""


def _megatron_text(run: RunConfig, ex: Export) -> str:
    args = []
    for name, v in ex.options:
        flag = MEGATRON_FLAGS.get(name, "--" + name.replace("_", "-"))
        if v is True:
            args.append(flag)
        elif v is False:
            if name in MEGATRON_OFF_FLAGS:
                args.append(MEGATRON_OFF_FLAGS[name])
            continue
        elif isinstance(v, list):  # nargs='*' (--recompute-modules core_attn moe_act)
            args.append(" ".join([flag, *map(shlex.quote, map(str, v))]))
        else:
            args.append(f"{flag} {shlex.quote(str(v))}")  # a layout string holds | and *
    return "\n".join(_header(run, ex) + [a + " \\" for a in args[:-1]] + args[-1:]) + "\n"


def _yaml_scalar(v: Any) -> str:
    import yaml
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def _primus_text(run: RunConfig, ex: Export) -> str:
    lines = _header(run, ex) + ["# paste under your experiment YAML (Megatron backend)", "modules:",
                                "  pre_trainer:", "    overrides:"]
    lines += [f"      {name}: {_yaml_scalar(v)}" for name, v in ex.options]
    return "\n".join(lines) + "\n"


def _torchtitan_text(run: RunConfig, ex: Export) -> str:
    """``--section.key value`` overrides (``--section.no_key`` for false), the activation-checkpoint
    subcommand last (tyro reads what follows a subcommand as its own options)."""
    args = []
    for name, v in ex.options:
        if "." not in name:
            args.append(f"{name}:{v}")
        elif isinstance(v, bool):
            sec, key = name.split(".", 1)
            args.append(f"--{name}" if v else f"--{sec}.no_{key}")
        elif isinstance(v, list):
            args.append(" ".join([f"--{name}", *map(shlex.quote, map(str, v))]))
        else:
            args.append(f"--{name} {shlex.quote(str(v))}")
    head = _header(run, ex) + ["# TorchTitan 0.3: append to  torchrun ... -m torchtitan.train --module MODEL "
                               "--config CONFIG_FUNCTION"]
    return "\n".join(head + [a + " \\" for a in args[:-1]] + args[-1:]) + "\n"


def export_run(run: RunConfig, target: str) -> str:
    """The text of ``run`` exported to ``target`` (megatron | primus | torchtitan)."""
    ex = build_export(run, target)
    return {"megatron": _megatron_text, "primus": _primus_text, "torchtitan": _torchtitan_text}[target](run, ex)


def load_config_or_winner(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """A RunConfig from a config YAML/JSON, or from a results directory (its winner / optimum)."""
    p = Path(path)
    if not p.is_dir():
        return RunConfig.load(p, overrides or [])
    summary_path = p / "summary.json"
    if not summary_path.exists():
        raise InvalidConfigError(f"{str(p)!r} is a directory without summary.json: give a config YAML or the "
                                 f"results directory of a tune/compare run")
    from oracle.config import apply_overrides
    from raytune_primus.summary_file import read_summary
    summary = read_summary(summary_path)
    w = summary.get("winner") or {}
    proj = w.get("projection") or {}
    if isinstance(proj.get("config"), dict):
        data = proj["config"]
    else:
        training = w.get("config") or (summary.get("optimum") or {}).get("config")
        if not training:
            raise InvalidConfigError(f"{str(summary_path)!r} has no winner (no candidate fit in memory)")
        from searchers.experiment import load_experiment
        if not summary.get("experiment"):
            raise InvalidConfigError(f"{str(summary_path)!r} names no experiment, so its winner's model and cluster "
                                     f"are unknown: give the run's config YAML instead")
        data = {**load_experiment(summary["experiment"]).space.baseline.to_dict(), "training": training}
    return RunConfig.from_dict(apply_overrides(data, overrides or []), where=str(summary_path))
