"""Exports round-trip: Megatron args parse with an argparse mirror, Primus YAML and TorchTitan overrides load back.

The mirror needs no framework installed; tests/frameworks/ checks the same exports against Megatron-LM's,
Megatron-Core's and TorchTitan's own parsers and config classes."""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig, TrainingConfig
from oracle.errors import InvalidConfigError
from raytune_primus.cli import main
from raytune_primus.export import build_export, export_run, load_config_or_winner
from tests.conftest import ROOT

CONFIG = ROOT / "tests" / "fixtures" / "configs" / "llama70b-h100.yaml"


def tiny(hardware: str = "h100-sxm", **training):
    base = {"seq_len": 2048, "gbs": 64, "mbs": 1, "tp": 1, "pp": 2, "vpp": 1, "ep": 2}
    return RunConfig.from_dict({"model": "tiny-moe", "cluster": {"hardware": hardware, "num_gpus": 8},
                                "training": {**base, **training}})


def megatron_parser() -> argparse.ArgumentParser:
    """A mirror of the Megatron-LM arguments the export may write (names and types as in arguments.py)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    for name in ("tensor-model-parallel-size", "pipeline-model-parallel-size", "num-layers-per-virtual-pipeline-stage",
                 "num-virtual-stages-per-pipeline-rank", "context-parallel-size", "expert-model-parallel-size",
                 "expert-tensor-parallel-size", "micro-batch-size", "global-batch-size", "seq-length",
                 "recompute-num-layers", "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--recompute-modules", nargs="*", type=str)
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], dest="fp8")
    p.add_argument("--fp8-recipe", choices=["delayed", "tensorwise", "mxfp8", "blockwise"])
    p.add_argument("--fp4-format", choices=["e2m1"], dest="fp4")
    p.add_argument("--fp4-recipe", choices=["nvfp4"])
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep", "ncclep"])
    p.add_argument("--pipeline-model-parallel-layout", type=str)
    p.add_argument("--hybrid-layer-pattern", type=str)
    p.add_argument("--moe-expert-capacity-factor", type=float)
    p.add_argument("--cuda-graph-impl", choices=["none", "local", "transformer_engine", "full_iteration"])
    p.add_argument("--cuda-graph-modules", nargs="*", type=str)
    p.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad")
    p.add_argument("--data-parallel-sharding-strategy", choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--ckpt-format", type=str)
    for flag in ("sequence-parallel", "bf16", "use-distributed-optimizer", "overlap-grad-reduce",
                 "overlap-param-gather", "tp-comm-overlap", "use-megatron-fsdp", "grad-reduce-in-bf16",
                 "cross-entropy-loss-fusion", "account-for-embedding-in-pipeline-split",
                 "account-for-loss-in-pipeline-split", "overlap-moe-expert-parallel-comm", "delay-wgrad-compute",
                 "moe-pad-expert-input-to-capacity", "moe-grouped-gemm"):
        p.add_argument(f"--{flag}", action="store_true")
    return p


def parse_megatron(text: str) -> argparse.Namespace:
    body = " ".join(line.rstrip("\\ ") for line in text.splitlines() if line and not line.startswith("#"))
    return megatron_parser().parse_args(shlex.split(body))


def parse_torchtitan(text: str) -> dict[str, dict]:
    """TorchTitan overrides back into sections: ``--sec.key v`` -> {sec: {key: v}}, ``--sec.key`` -> True,
    ``--sec.no_key`` -> False; the ``activation_checkpoint:<mode>`` subcommand -> {"activation_checkpoint":
    {"mode": mode}}."""
    body = " ".join(line.rstrip("\\ ") for line in text.splitlines() if line and not line.startswith("#"))
    doc: dict[str, dict] = {}
    tokens = shlex.split(body)
    for i, tok in enumerate(tokens):
        if not tok.startswith("--"):
            if ":" in tok:
                sec, mode = tok.split(":")
                doc.setdefault(sec, {})["mode"] = mode
            continue
        sec, key = tok[2:].split(".", 1)
        values = []
        for nxt in tokens[i + 1:]:
            if nxt.startswith("--") or ":" in nxt:
                break
            values.append(nxt)
        if not values:
            doc.setdefault(sec, {})[key.removeprefix("no_")] = not key.startswith("no_")
        else:
            vals = [int(v) if v.lstrip("-").isdigit() else v for v in values]
            doc.setdefault(sec, {})[key] = vals[0] if len(vals) == 1 else vals
    return doc


def options(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def test_the_megatron_export_pasted_whole_into_megatron_args_is_the_same_run(capsys):
    # its '#' lines (one says "the model's recipe": an unclosed quote to shlex) and its backslash-newlines made
    # 'project --megatron-args' refuse the text as exported; read as the shell reads it, it projects the same run
    run = RunConfig.load(CONFIG)
    text = export_run(run, "megatron")
    assert "'" in comments(text) and "\\\n" in text
    from oracle.recipe import read_recipe, split_megatron_args
    stripped = " ".join(line.rstrip("\\ ") for line in text.splitlines() if line and not line.startswith("#"))
    assert split_megatron_args(text) == split_megatron_args(stripped)
    back = read_recipe(split_megatron_args(text)).training
    t = run.training
    assert (back["tp"], back["pp"], back["mbs"], back["gbs"], back["seq_len"]) == (t.tp, t.pp, t.mbs, t.gbs, t.seq_len)
    from raytune_primus.cli import main
    assert main(["project", "--model", run.model_ref, "--hardware", run.hardware_ref, "--num-gpus",
                 str(run.cluster.num_gpus), f"--megatron-args={text}", "--format", "json", "--no-hints"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["training"]["tp"] == t.tp


def test_megatron_round_trip_llama():
    run = RunConfig.load(CONFIG)
    t = run.training
    a = parse_megatron(export_run(run, "megatron"))
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size) == (t.tp, t.pp, t.cp)
    assert a.num_layers_per_virtual_pipeline_stage == run.model.num_layers // (t.pp * t.vpp)
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (t.mbs, t.gbs, t.seq_len)
    assert a.sequence_parallel == t.sp and a.tp_comm_overlap == t.tp_overlap
    assert a.use_distributed_optimizer == t.use_distributed_optimizer
    assert a.overlap_grad_reduce == t.overlap_grad_reduce and a.overlap_param_gather == t.overlap_param_gather
    assert a.bf16 and (a.fp8 == "hybrid") == (t.precision == "fp8")


def test_megatron_round_trip_moe_recompute_and_deepep():
    run = tiny(pp=2, vpp=2, ep=4, etp=1, recompute="full", recompute_num_layers=2, moe_a2a_backend="deepep",
               precision="fp8", pp_schedule="interleaved")
    a = parse_megatron(export_run(run, "megatron"))
    assert a.expert_model_parallel_size == 4 and a.expert_tensor_parallel_size == 1
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "block", 1)
    assert a.moe_token_dispatcher_type == "flex" and a.moe_flex_dispatcher_backend == "deepep"
    b = parse_megatron(export_run(tiny(recompute="full"), "megatron"))  # every layer
    assert (b.recompute_method, b.recompute_num_layers) == ("uniform", 1)
    c = parse_megatron(export_run(tiny(recompute="selective"), "megatron"))
    assert c.recompute_granularity == "selective" and c.recompute_method is None
    assert c.recompute_modules is None  # Megatron's default, core_attn
    d = tiny(recompute="selective", recompute_modules=["core_attn", "moe_act"])
    assert parse_megatron(export_run(d, "megatron")).recompute_modules == ["core_attn", "moe_act"]
    assert yaml.safe_load(export_run(d, "primus"))["modules"]["pre_trainer"]["overrides"]["recompute_modules"] == [
        "core_attn", "moe_act"]
    assert "recompute_modules=" in comments(export_run(d, "torchtitan"))  # listed as unsupported


def test_uneven_pipeline_layouts_are_exported():
    """Megatron's layout keys, read with getattr so configs from before and after they existed both work."""
    if "pipeline_model_parallel_layout" not in {f.name for f in dataclasses.fields(TrainingConfig)}:
        pytest.skip("this TrainingConfig has no uneven-layout keys")
    base = RunConfig.load(CONFIG, ["training.vpp=1", "training.pp=4"])
    layout = "Et*20|t*20|t*20|t*20,L"
    run = RunConfig.from_dict({**base.to_dict(), "training": {**base.to_dict()["training"],
                                                              "pipeline_model_parallel_layout": layout}})
    assert parse_megatron(export_run(run, "megatron")).pipeline_model_parallel_layout == layout  # shell-quoted
    o = yaml.safe_load(export_run(run, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert o["pipeline_model_parallel_layout"] == layout
    assert f"pipeline_model_parallel_layout={layout}" in comments(export_run(run, "torchtitan"))
    run = RunConfig.from_dict({**base.to_dict(), "training": {**base.to_dict()["training"],
                                                              "decoder_first_pipeline_num_layers": 18,
                                                              "decoder_last_pipeline_num_layers": 18}})
    a = parse_megatron(export_run(run, "megatron"))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (18, 18)


def test_unsupported_options_are_listed_not_dropped():
    # Primus-Turbo's sync-free MoE runs on AMD Instinct parts
    run = tiny("mi355x", pp=2, vpp=2, pp_schedule="zbv", moe_a2a_backend="deepep", moe_sync_free=True,
               moe_imbalance=1.3)
    meg = export_run(run, "megatron")
    assert "# not supported by megatron:" in meg and "pp_schedule=zbv" in comments(meg)
    assert "moe_sync_free=true" in comments(meg) and "moe_imbalance=1.3" in comments(meg)
    primus = export_run(run, "primus")
    assert "pp_schedule" not in comments(primus)  # Primus runs ZB-V itself
    tt = export_run(run, "torchtitan")
    assert "moe_a2a_backend=deepep" in comments(tt) and "moe_sync_free=true" in comments(tt)


def test_moe_a2a_overlap_exports_megatrons_two_flags():
    run = tiny(pp=2, vpp=2, moe_a2a_overlap=True)
    a = parse_megatron(export_run(run, "megatron"))
    assert a.overlap_moe_expert_parallel_comm and a.delay_wgrad_compute
    off = parse_megatron(export_run(tiny(pp=2, vpp=2), "megatron"))
    assert not off.overlap_moe_expert_parallel_comm and not off.delay_wgrad_compute
    o = yaml.safe_load(export_run(run, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert o["overlap_moe_expert_parallel_comm"] is True and o["delay_wgrad_compute"] is True
    assert "moe_a2a_overlap=true" in comments(export_run(run, "torchtitan"))


def test_fp8_recipe_exports_to_megatron_and_torchtitan():
    def on(hw, recipe):
        return RunConfig.from_dict({"model": "tiny-moe", "cluster": {"hardware": hw, "num_gpus": 8},
                                    "training": {"seq_len": 2048, "gbs": 64, "ep": 2, "precision": "fp8",
                                                 "fp8_recipe": recipe}})
    a = parse_megatron(export_run(on("b200", "mxfp8"), "megatron"))
    assert (a.fp8_recipe, a.fp8) == ("mxfp8", "e4m3")
    b = parse_megatron(export_run(on("h100-sxm", "tensorwise"), "megatron"))
    assert (b.fp8_recipe, b.fp8) == ("tensorwise", "hybrid")
    o = yaml.safe_load(export_run(on("b200", "mxfp8"), "primus"))["modules"]["pre_trainer"]["overrides"]
    assert (o["fp8"], o["fp8_recipe"]) == ("e4m3", "mxfp8")  # argparse's names (--fp8-format stores fp8)
    # TorchTitan 0.3 picks the converter in the model's config function: listed with the one to pick
    assert "MXFP8LinearConverter" in comments(export_run(on("b200", "mxfp8"), "torchtitan"))
    assert "Float8LinearConverter" in comments(export_run(on("h100-sxm", "tensorwise"), "torchtitan"))


def test_cuda_graphs_export_megatrons_impl_and_scope():
    run = tiny(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])
    a = parse_megatron(export_run(run, "megatron"))
    assert a.cuda_graph_impl == "transformer_engine" and a.cuda_graph_modules == ["attn", "moe_router", "moe_preprocess"]
    whole = parse_megatron(export_run(tiny(cuda_graph_impl="local", moe_expert_capacity_factor=1.0,
                                           moe_pad_expert_input_to_capacity=True), "megatron"))
    assert whole.cuda_graph_impl == "local" and whole.cuda_graph_modules is None  # Megatron's default: the whole layer
    off = parse_megatron(export_run(tiny(), "megatron"))
    assert off.cuda_graph_impl is None and off.cuda_graph_modules is None
    o = yaml.safe_load(export_run(run, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert o["cuda_graph_impl"] == "transformer_engine" and o["cuda_graph_modules"] == ["attn", "moe_router", "moe_preprocess"]
    # Megatron-Core 0.19: full-iteration graphs are an impl, and run without the NaN check
    full = parse_megatron(export_run(tiny(pp=1, cuda_graph_impl="local", cuda_graph_scope=["full_iteration"],
                                          moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
                                     "megatron"))
    assert full.cuda_graph_impl == "full_iteration" and not full.check_for_nan_in_loss_and_grad
    assert full.cuda_graph_modules is None
    tt = parse_torchtitan(export_run(tiny(), "torchtitan"))
    assert tt["training"]["disable_cuda_graphs"] is True  # TorchTitan 0.3 captures the step unless told not to


def test_primus_yaml_round_trip():
    run = tiny("mi355x", pp=2, vpp=2, pp_schedule="v_half", recompute="full", recompute_num_layers=2, moe_sync_free=True,
               moe_a2a_backend="deepep", overlap_param_gather=False)
    doc = yaml.safe_load(export_run(run, "primus"))
    o = doc["modules"]["pre_trainer"]["overrides"]
    assert o["tensor_model_parallel_size"] == 1 and o["pipeline_model_parallel_size"] == 2
    assert o["expert_model_parallel_size"] == 2 and o["micro_batch_size"] == 1 and o["seq_length"] == 2048
    assert o["zero_bubble_v_schedule"] is True and o["zero_bubble_v_schedule_mem_setup"] == "half"
    assert o["overlap_param_gather"] is False and o["use_turbo_deepep"] is True
    assert o["recompute_num_layers"] == 1 and o["turbo_sync_free_moe_stage"] == 2


def test_torchtitan_overrides_round_trip():
    run = RunConfig.load(CONFIG, ["training.fsdp=true", "training.use_distributed_optimizer=false",
                                  "training.recompute=selective"])
    t = run.training
    doc = parse_torchtitan(export_run(run, "torchtitan"))
    par = doc["parallelism"]
    dp = run.cluster.num_gpus // (t.tp * t.pp * t.cp)
    assert par["tensor_parallel_degree"] == t.tp and par["pipeline_parallel_degree"] == t.pp
    assert par["data_parallel_shard_degree"] == dp and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_layers_per_stage"] == run.model.num_layers // (t.pp * t.vpp)
    assert par["pipeline_parallel_microbatch_size"] == t.mbs
    assert doc["training"]["seq_len"] == t.seq_len and doc["training"]["global_batch_size"] == t.gbs
    assert doc["training"]["local_batch_size"] * dp == t.gbs
    assert doc["activation_checkpoint"]["mode"] == "selective"
    assert "parallelism.enable_sequence_parallel" not in export_run(run, "torchtitan")  # SP on: TorchTitan's default
    assert "precision=fp8" in comments(export_run(run, "torchtitan")) or t.precision != "fp8"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({
    "pp": st.sampled_from([1, 2]), "ep": st.sampled_from([1, 2, 4]), "mbs": st.sampled_from([1, 2]),
    "recompute": st.sampled_from(["none", "selective", "full"]), "precision": st.sampled_from(["bf16", "fp8"]),
    "moe_a2a_backend": st.sampled_from(["alltoall", "deepep"]), "fsdp": st.booleans(),
    "overlap_grad_reduce": st.booleans(), "loss_fusion": st.booleans(), "moe_imbalance": st.sampled_from([1.0, 1.2])}))
def test_every_training_key_is_exported_or_listed(training):
    if training["fsdp"]:
        training["use_distributed_optimizer"] = False
    try:
        run = tiny(**training)
    except InvalidConfigError:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingConfig) if f.default is not dataclasses.MISSING}
    for target in ("megatron", "primus", "torchtitan"):
        ex = build_export(run, target)
        listed = {k for k, _, _ in ex.unsupported + ex.projection_only}
        text = export_run(run, target)
        for key, default in defaults.items():
            if key in listed or getattr(run.training, key) == default:
                continue
            try:
                other = dataclasses.replace(run, training=run.training.replace(**{key: default}))
                other.check()
            except InvalidConfigError:
                continue
            # a non-default value that is not listed must show in the options: resetting it changes them
            assert options(export_run(other, target)) != options(text), (target, key)
        if run.training.moe_imbalance != 1.0:
            assert "moe_imbalance=1.2" in comments(text)
        if target == "megatron":
            parse_megatron(text)
        elif target == "primus":
            assert yaml.safe_load(text)["modules"]["pre_trainer"]["overrides"]
        else:
            assert parse_torchtitan(text)["parallelism"]


def test_export_cli_config_and_results_dir(capsys, tmp_path):
    assert main(["export", str(CONFIG), "--to", "megatron", "--set", "training.tp=8"]) == 0
    assert parse_megatron(capsys.readouterr().out).tensor_model_parallel_size == 8
    # a results directory: its winner's full config
    run = RunConfig.load(CONFIG)
    (tmp_path / "summary.json").write_text(json.dumps({"experiment": "x", "winner": {
        "tokens_per_s_per_gpu": 1.0, "config": run.to_dict()["training"], "projection": {"config": run.to_dict()}}}))
    assert load_config_or_winner(tmp_path).key() == run.key()
    out = tmp_path / "torchtitan-overrides.txt"
    assert main(["export", str(tmp_path), "--to", "torchtitan", "-o", str(out)]) == 0
    assert parse_torchtitan(out.read_text())["parallelism"]["tensor_parallel_degree"] == run.training.tp
    capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(empty), "--to", "primus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.json" in err


def test_a_hybrid_model_layout_is_exported_as_stage_boundaries_in_its_pattern():
    """Megatron-LM takes a hybrid model's (virtual) stages from '|' in --hybrid-layer-pattern and refuses the layout
    and virtual-stage flags beside it; TorchTitan has no Mamba layer and says so."""
    layout = "E" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "|" + "t" * 13 + "L"
    run = RunConfig.from_dict({"model": "nemotronh-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
                               "training": {"seq_len": 8192, "gbs": 64, "tp": 2, "pp": 2, "vpp": 2,
                                            "pipeline_model_parallel_layout": layout}})
    text = export_run(run, "megatron")
    assert "--pipeline-model-parallel-layout" not in text and "--num-virtual-stages-per-pipeline-rank" not in text
    pattern = parse_megatron(text).hybrid_layer_pattern
    segments = pattern.split("|")
    assert len(segments) == 4 and all(len(x) == 13 for x in segments)
    assert "".join(segments) == run.model.hybrid_pattern
    assert "TorchTitan 0.3 has no Mamba layer" in comments(export_run(run, "torchtitan"))
