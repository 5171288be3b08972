"""framework=torchtitan: TorchTitan's PyTorch-native kernels on the op graph (eager and compiled), its
op-level selective checkpointing, one-kernel grouped experts, its defaults, what it cannot run, and how
validate and export read it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import layer_activation_bytes, op_sac_plan
from oracle.compute import LayerModel
from oracle.config import FRAMEWORK_DEFAULTS, RunConfig
from oracle.errors import InvalidConfigError
from oracle.gemm import gemm_time_s
from oracle.hardware import load_hardware
from oracle.layout import Layout
from oracle.model_card import load_model
from oracle.opgraph import (BF16, EAGER_RMSNORM_BYTES, EAGER_ROPE_BYTES, EAGER_SWIGLU_BYTES, FP32, GEMM, Shapes,
                            layer_ops, output_ops)
from oracle.projector import comm_model, project
from oracle.validate import validate_rows
from raytune_primus.export import build_export, export_run


def _run(model: str = "llama3-8b", n: int = 8, hw: str = "h100-sxm", **training) -> RunConfig:
    tr = {"seq_len": 4096, "gbs": 16, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": tr})


def _ops(run: RunConfig, kind: str = "dense") -> dict:
    return {op.name: op for op in layer_ops(run.model, Shapes.of(run), kind)}


# ---------------------------------------------------------------- the kernels each framework runs
def test_eager_elementwise_bytes_are_the_hand_count_and_compiled_ones_are_fused():
    """Llama 3 8B, one micro-batch of 4,096 tokens: the eager composite RMSNorm moves 36 B per element,
    complex-number RoPE 20 B per q/k element, silu-then-multiply 10 B per FFN element; torch.compile
    fuses each to the bytes of Megatron's fused kernels."""
    card = load_model("llama3-8b")
    T, H, F = 4096, card.hidden_size, card.ffn_hidden_size
    qk = T * (card.q_width + card.kv_heads * card.head_size)
    eager = _ops(_run(framework="torchtitan"))
    assert eager["attn_norm"].bytes_f == EAGER_RMSNORM_BYTES * T * H == 36 * T * H
    assert eager["rope"].bytes_f == EAGER_ROPE_BYTES * qk
    assert eager["mlp_act"].bytes_f == EAGER_SWIGLU_BYTES * T * F
    compiled, megatron = _ops(_run(framework="torchtitan", torch_compile=True)), _ops(_run())
    for name in ("attn_norm", "rope", "mlp_act", "mlp_norm", "attn_residual"):
        assert compiled[name].bytes_f == megatron[name].bytes_f
    # GQA heads repeated before SDPA (read 8 KV heads, write 32 query heads, for K and V) in both modes
    rep = 2 * BF16 * T * (card.kv_heads + card.num_attention_heads) * card.head_size
    assert eager["repeat_kv"].bytes_f == compiled["repeat_kv"].bytes_f == rep
    assert "repeat_kv" not in megatron
    # the same GEMMs either way: FLOPs are the model's, not the framework's
    assert {n: o.flops_f for n, o in eager.items() if o.kind == GEMM} == \
        {n: o.flops_f for n, o in megatron.items() if o.kind == GEMM}


def test_torchtitan_loss_reads_fp32_logits_and_keeps_fp32_log_probs():
    run = _run(framework="torchtitan")
    s = Shapes.of(run)
    v = run.model.padded_vocab(1)
    loss = {op.name: op for op in output_ops(run.model, s, v, run.training.loss_fusion)}
    assert loss["loss"].bytes_f == 18 * s.T * v
    assert {t.name: t.bytes for t in loss["logits"].saved}["log_probs_fp32"] == FP32 * s.T * v


def test_grouped_experts_as_one_kernel_never_take_longer_than_four_streams():
    hw = load_hardware("b200")
    for m, n, k, g in [(256, 1536, 2048, 16), (1024, 4096, 7168, 32), (8192, 4096, 7168, 4), (37, 768, 2048, 128)]:
        assert gemm_time_s(hw, m, n, k, "fp8", g, True) <= gemm_time_s(hw, m, n, k, "fp8", g, False)
    ops = _ops(_run("qwen3-30b-a3b", ep=8, framework="torchtitan"), "moe")
    assert ops["experts_up"].fused_groups and ops["experts_up"].loop_launches == 0
    assert not _ops(_run("qwen3-30b-a3b", ep=8), "moe")["experts_up"].fused_groups


@settings(max_examples=25, deadline=None)
@given(mbs=st.sampled_from([1, 2]), seq=st.sampled_from([2048, 4096, 8192]), tp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "selective", "full"]), fp8=st.booleans())
def test_eager_is_never_faster_than_compiled(mbs, seq, tp, recompute, fp8):
    kw = dict(seq_len=seq, mbs=mbs, gbs=8 * mbs, tp=tp, recompute=recompute, framework="torchtitan",
              precision="fp8" if fp8 else "bf16")
    eager = project(_run(n=8 * tp, **kw), memory_tree=False)
    compiled = project(_run(n=8 * tp, torch_compile=True, **kw), memory_tree=False)
    assert eager.iteration_time_s >= compiled.iteration_time_s
    assert eager.memory.peak_bytes >= compiled.memory.peak_bytes


# ---------------------------------------------------------------- op-level selective checkpointing
def test_op_level_checkpointing_saves_attention_and_every_other_matmul():
    """torchtitan's _get_custom_policy on a Llama block: the matmul calls wq wk wv wo w1 w3 w2 are
    counted 1..7 and the odd ones saved (wq, wv, w1, w2) with SDPA's output and logsumexp; the block
    input is the checkpoint; wk, wo, w3 and every elementwise op are replayed in backward."""
    card = load_model("llama3-8b")
    run = _run(framework="torchtitan", recompute="selective")
    T, H, F, d = 4096, card.hidden_size, card.ffn_hidden_size, card.head_size
    q_w, kv_w, heads = card.q_width, card.kv_heads * d, card.num_attention_heads
    saved = T * BF16 * (H + q_w + kv_w + q_w + F + H) + heads * T * FP32
    assert layer_activation_bytes(run, "dense") == pytest.approx(saved, rel=1e-12)
    ops = layer_ops(card, Shapes.of(run), "dense")
    replay = {op.name: share for op, (_, share) in zip(ops, op_sac_plan(ops))}
    assert replay["qkv"] == pytest.approx(kv_w / (q_w + 2 * kv_w))  # wk
    assert replay["attn_out"] == 1.0 and replay["mlp_up"] == 0.5 and replay["mlp_down"] == 0.0
    assert replay["attn_core"] == 0.0 and replay["attn_norm"] == replay["rope"] == replay["mlp_act"] == 1.0
    # its recompute is that replay, priced op by op
    lm = LayerModel(Layout(run), comm_model(run.cluster.hardware, run.cluster.num_gpus))
    cost = lm.layer("dense")
    assert cost.replay_f_s == pytest.approx(sum(f * replay[op.name] for op, f, _, _ in cost.ops))
    assert 0 < cost.replay_f_s < cost.f_s


def test_op_level_checkpointing_sits_between_none_and_full():
    for model in ("llama3-8b", "qwen3-30b-a3b"):
        kw = dict(ep=8) if model.startswith("qwen") else {}
        acts = {r: layer_activation_bytes(_run(model, framework="torchtitan", recompute=r, **kw),
                                          "moe" if kw else "dense") for r in ("none", "selective", "full")}
        assert acts["full"] < acts["selective"] < acts["none"]
        times = {r: project(_run(model, framework="torchtitan", recompute=r, **kw), memory_tree=False).iteration_time_s
                 for r in ("none", "selective", "full")}
        assert times["none"] < times["selective"] < times["full"]


# ---------------------------------------------------------------- defaults, legality
def test_torchtitan_defaults_fill_only_unstated_keys():
    t = _run(framework="torchtitan").training
    for k, v in FRAMEWORK_DEFAULTS["torchtitan"].items():
        assert getattr(t, k) == v
    assert not _run(framework="torchtitan", fsdp=False).training.fsdp
    assert _run().training.fsdp is False and _run().training.use_distributed_optimizer  # Megatron unchanged


@pytest.mark.parametrize("training, needle", [
    ({"framework": "torchtitan", "fsdp": False, "use_distributed_optimizer": True},
     "framework=torchtitan has no distributed optimizer without FSDP"),
    ({"framework": "torchtitan", "recompute": "selective", "recompute_modules": ["core_attn"]},
     "recompute_modules with framework=torchtitan"),
    ({"framework": "torchtitan", "tp": 2, "tp_comm_overlap": True}, "async tensor parallelism needs torch_compile"),
    ({"torch_compile": True}, "torch_compile=true needs framework=torchtitan"),
    ({"framework": "pytorch"}, "framework"),
])
def test_what_torchtitan_cannot_run_is_one_line_naming_it(training, needle):
    with pytest.raises(InvalidConfigError) as exc:
        _run(n=16, **training)
    assert any(needle in line for line in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("model, hardware, training", [
    ("qwen3-30b-a3b", "b200", {"ep": 8, "moe_a2a_backend": "deepep"}),
    ("qwen3-30b-a3b", "gb200-nvl72", {"ep": 8, "moe_a2a_backend": "hybridep"}),
    ("llama3.1-8b", "b200", {"precision": "nvfp4"}),
])
def test_torchtitan_03_runs_deepep_hybridep_and_nvfp4(model, hardware, training):
    """TorchTitan 0.3 has DeepEP / HybridEP token dispatchers and an NVFP4 converter: projected, not refused; the
    export says they are chosen in the model's config function."""
    from oracle.projector import project
    from raytune_primus.export import export_run
    run = RunConfig.from_dict({"model": model, "cluster": {"hardware": hardware, "num_gpus": 16},
                               "training": {"seq_len": 4096, "gbs": 128, "framework": "torchtitan", **training}})
    assert project(run, memory_tree=False).tokens_per_s_per_gpu > 0
    text = export_run(run, "torchtitan")
    assert "model's config function" in text


def test_torchtitan_without_sequence_parallelism_is_legal():
    """TorchTitan 0.3 turns sequence parallelism off with --parallelism.no_enable_sequence_parallel."""
    assert not _run(n=16, framework="torchtitan", tp=2, sequence_parallel=False).training.sp


def test_async_tp_with_compile_is_legal():
    run = _run(n=16, tp=2, framework="torchtitan", torch_compile=True, tp_comm_overlap=True)
    assert run.training.tp_overlap


# ---------------------------------------------------------------- validate and export
_TITAN_SOURCE = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"


def _row(**cells: str) -> dict[str, str]:
    return {"id": "r", "group": "g", "quality": "A", "model": "llama3.1-8b", "hardware": "H100-SXM-96GB-HBM2e-500W",
            "num_gpus": "8", "seq_len": "8192", "gbs": "16", "mbs": "2", "precision": "bf16",
            "recompute": "selective", "measured_tokens_per_s_per_gpu": "1000", **cells}


@pytest.mark.parametrize("notes, compiled", [("FSDP + torch.compile + Float8", True), ("FSDP, compile", True),
                                             ("FSDP; selective op AC", False), ("eager, no compile", False)])
def test_validate_reads_torchtitan_from_the_source_and_compile_from_the_notes(notes, compiled):
    [res] = validate_rows([_row(source=_TITAN_SOURCE, notes=notes)])
    assert res.skipped is None, res.skipped
    t = res.projection.config["training"]
    assert t["framework"] == "torchtitan" and t["torch_compile"] is compiled and t["fsdp"] is True
    assert any(a.startswith("framework=torchtitan") for a in res.assumed)
    assert any("TorchTitan's defaults" in a for a in res.assumed)


@pytest.mark.parametrize("published", ["selective op", "SAC", "op"])
def test_validate_reads_torchtitans_checkpointing_spellings(published):
    [res] = validate_rows([_row(source=_TITAN_SOURCE, notes="", recompute=published)])
    assert res.skipped is None, res.skipped
    assert res.projection.config["training"]["recompute"] == "selective"
    assert any(a.startswith("recompute=selective (published") for a in res.assumed)


def test_validate_leaves_other_rows_megatron_and_a_stated_framework_alone():
    [plain] = validate_rows([_row(source="https://github.com/NVIDIA-NeMo/Megatron-Bridge", notes="")])
    assert plain.projection.config["training"]["framework"] == "megatron"
    [stated] = validate_rows([_row(source=_TITAN_SOURCE, framework="megatron", notes="compile")])
    assert stated.projection.config["training"]["framework"] == "megatron"
    assert not any(a.startswith("framework=") for a in stated.assumed)


def test_exports_say_which_kernels_were_priced():
    titan = _run(n=16, tp=2, framework="torchtitan", torch_compile=True, recompute="selective")
    text = export_run(titan, "torchtitan")
    assert "--compile.enable" in text.split()
    assert "loss_fusion" not in text  # TorchTitan's own loss, not a missing switch
    mega = build_export(titan, "megatron")
    assert any(k == "framework" and v == "torchtitan" for k, v, _ in mega.unsupported)
    assert any(k == "framework" for k, _, _ in build_export(_run(), "torchtitan").unsupported)


def test_op_level_checkpointing_is_priced_whichever_framework_was_projected_first():
    """The per-placement tables the memory model caches hold each layer's recompute policy: a Megatron run
    (module-level selective) projected first must not leave its policy to a TorchTitan run (op-level SAC) of
    the same placement."""
    from oracle import memory

    titan = _run(n=8, framework="torchtitan", recompute="selective", pp=2)
    megatron = _run(n=8, recompute="selective", pp=2)

    def fresh(*runs):
        memory.clear_caches()
        return [memory.project_memory(r, trees="none").peak_bytes for r in runs][-1]

    alone = fresh(titan)
    assert fresh(megatron, titan) == alone
    assert fresh(titan, megatron) == fresh(megatron)


def test_torchtitan_fsdp_under_pipeline_parallelism_gathers_once_and_keeps_the_stage_unsharded():
    """TorchTitan's default reshard policy under PP (get_fsdp_reshard_after_forward_policy: not pp_enabled): the
    weights are gathered once per step and kept, the gradients accumulated unsharded in the fp32 reduce dtype; without
    PP every micro-batch gathers in forward and again in backward. Megatron-FSDP is unchanged."""
    from oracle.memory import project_memory, rank_param_counts
    from oracle.projector import project
    kw = dict(framework="torchtitan", tp=2, pp=2, mbs=1, gbs=64, recompute="full")
    run = _run("llama3.1-8b", n=16, **kw)
    assert run.training.fsdp_keeps_unsharded
    proj = project(run, memory_tree=False)
    ag = next(c for c in proj.breakdown.comm if c.kind == "fsdp_ag")
    # the same stage's gather, as the per-micro-batch rule would count it: 16 micro-batches (dp 4, MBS 1), twice each
    no_pp = next(c for c in project(_run("llama3.1-8b", n=16, **{**kw, "pp": 1}), memory_tree=False).breakdown.comm
                 if c.kind == "fsdp_ag")
    assert ag.exposed_s <= ag.total_s and no_pp.total_s > 16 * ag.total_s
    dense, _ = rank_param_counts(run, 0)
    stage = max(project_memory(run, trees="none").stages, key=lambda s: s.total_bytes)
    assert stage.params_bytes >= 2 * dense * 0.999 and stage.grads_bytes >= 4 * dense * 0.999  # whole, not / dp
    megatron = _run("llama3.1-8b", n=16, tp=2, pp=2, mbs=1, gbs=64, recompute="full", fsdp=True,
                    use_distributed_optimizer=False)
    assert not megatron.training.fsdp_keeps_unsharded
