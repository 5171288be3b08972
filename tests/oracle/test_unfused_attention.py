"""Unfused attention (training.attention_backend=unfused): priced from its batched GEMMs and softmax passes."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.compute import price_op, unfused_attention_s
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import project_memory
from oracle.opgraph import UNFUSED_SOFTMAX, Shapes, layer_ops
from oracle.projector import project
from oracle.recipe import read_recipe

HW = ["h100-sxm", "b200", "gb300-nvl72", "mi300x", "mi355x", "a100-80gb"]


def _run(model: str = "llama3.1-8b", hw: str = "h100-sxm", n: int = 8, **training) -> RunConfig:
    tr = {"seq_len": 4096, "gbs": 64, **training}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": tr})


def _core(run: RunConfig, window: int | None = None):
    kind = "moe" if run.model.is_moe else "dense"
    return next(op for op in layer_ops(run.model, Shapes.of(run), kind, window) if op.name == "attn_core")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(hw=st.sampled_from(HW), model=st.sampled_from(["llama3.1-8b", "qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3"]),
       seq=st.sampled_from([1000, 2048, 4096, 8192, 20000]), mbs=st.sampled_from([1, 2, 4]),
       tp=st.sampled_from([1, 2, 4]), windowed=st.booleans())
def test_unfused_attention_is_never_faster_than_the_fused_kernel(hw, model, seq, mbs, tp, windowed):
    """The same attention materialised: the full square at the GEMM rate plus the scores' HBM round trips costs at
    least what the tiled kernel does over the pairs it visits, forward and backward together, from a thousand tokens
    on. (Below, the tiled kernel's one block per 128 queries can leave most compute units idle, e.g. 64 blocks on
    MI300X's 304 CUs at 512 tokens and 16 heads, while the batched GEMMs fill them: there unfused may win.)"""
    kw = dict(seq_len=seq, mbs=mbs, tp=tp, ep=8 if model != "llama3.1-8b" else 1)
    fused, unfused = _run(model, hw, **kw), _run(model, hw, **kw, attention_backend="unfused")
    window = 128 if windowed else None
    f0, b0, _ = price_op(fused.cluster.hardware, _core(fused, window))
    f1, b1, w1 = price_op(unfused.cluster.hardware, _core(unfused, window))
    assert f1 >= f0 and f1 + b1 >= f0 + b0 and w1 == 0.0


@pytest.mark.parametrize("hw", HW)
def test_unfused_attention_moves_the_score_matrix_through_hbm(hw):
    """Physical floor: forward writes the scores (QK^T), the softmax reads and writes them, PV reads them again;
    none of that at more than the part's HBM bandwidth. The executed FLOPs are the full square's."""
    run = _run(hw=hw, seq_len=8192, attention_backend="unfused")
    op = _core(run)
    assert op.softmax == "kernel" and op.s_k == 8192
    scores = op.batch_heads * op.s_q * op.seq
    assert op.flops_f == pytest.approx(2.0 * scores * (op.d_qk + op.d_v))
    h = run.cluster.hardware
    f, b, _ = unfused_attention_s(h, op)
    assert f >= scores * (2 + UNFUSED_SOFTMAX["kernel"].fwd_bytes + 2) / h.hbm_bandwidth_bytes_per_s
    assert b >= scores * (2 + UNFUSED_SOFTMAX["kernel"].bwd_bytes + 2) / h.hbm_bandwidth_bytes_per_s


def test_which_softmax_runs():
    """Transformer Engine's fused softmax kernel for a plain causal mask within its sizes; PyTorch's fp32 path for a
    sliding window, softmax sinks or keys past the kernel's limit, which costs more per score and keeps more."""
    assert _core(_run(attention_backend="unfused")).softmax == "kernel"
    assert _core(_run(attention_backend="unfused"), window=128).softmax == "torch"
    assert _core(_run(attention_backend="unfused", seq_len=16384)).softmax == "torch"
    assert _core(_run("gpt-oss-120b", "b200", ep=8, attention_backend="unfused")).softmax == "torch"
    assert _core(_run()).softmax == ""
    k, t = UNFUSED_SOFTMAX["kernel"], UNFUSED_SOFTMAX["torch"]
    assert t.fwd_bytes > k.fwd_bytes and t.bwd_bytes > k.bwd_bytes and t.saved_bytes > k.saved_bytes


def test_unfused_attention_keeps_the_probabilities_unless_core_attention_is_recomputed():
    """No recompute: every layer keeps its b x a/tp x s x s bf16 probabilities (the K22 term) and the repeated K and
    V; selective recompute (core_attn) drops the probabilities again."""
    card_layers = _run().model.num_layers

    def act(**kw):
        return project_memory(_run(seq_len=4096, mbs=1, **kw), trees="none").stages[0].activations_bytes
    probs = 32 * 4096 * 4096 * 2  # heads x s x s x bf16 per layer (TP 1, MBS 1)
    kv_repeat = 2 * 4096 * (4096 - 1024) * 2  # K and V expanded from 8 to 32 heads of 128
    assert act(recompute="none", attention_backend="unfused") - act(recompute="none") == pytest.approx(
        card_layers * (probs + kv_repeat - 32 * 4096 * 4), rel=1e-9)  # the fused kernel's fp32 logsumexp instead
    assert act(recompute="selective", attention_backend="unfused") < act(recompute="none", attention_backend="unfused")
    assert act(recompute="selective", attention_backend="unfused") - act(recompute="selective") == pytest.approx(
        card_layers * kv_repeat, rel=1e-9)


def test_projection_slows_and_selective_recompute_replays_the_unfused_forward():
    fused = project(_run(seq_len=8192, recompute="selective"), memory_tree=False)
    unfused = project(_run(seq_len=8192, recompute="selective", attention_backend="unfused"), memory_tree=False)
    assert unfused.tokens_per_s_per_gpu < fused.tokens_per_s_per_gpu
    assert unfused.breakdown.recompute_s > fused.breakdown.recompute_s


@pytest.mark.parametrize("training, needle", [
    ({"attention_backend": "unfused", "cp": 2}, "cp=2"),
    ({"attention_backend": "unfused", "precision": "fp8", "fp8_dot_product_attention": True}, "fp8_dot_product_attention"),
    ({"attention_backend": "local"}, "--spec local"),
    ({"attention_backend": "unfused", "framework": "torchtitan"}, "framework=torchtitan"),
    ({"attention_backend": "sdpa"}, "sdpa"),
])
def test_refused_attention_backends_name_the_value(training, needle):
    with pytest.raises(InvalidConfigError, match=needle.replace("-", r"\-")):
        _run(n=8, **training)


@pytest.mark.parametrize("value", ["AttnBackend.unfused", "unfused", " UNFUSED "])
def test_recipe_reads_the_attention_backend(value):
    r = read_recipe({"attention_backend": value})
    assert r.training["attention_backend"] == "unfused" and not r.ignored
    assert read_recipe({"attention_backend": None}).training["attention_backend"] == "auto"
    with pytest.raises(InvalidConfigError, match="valid attention backends are auto, flash, fused, unfused, local"):
        read_recipe({"attention_backend": "AttnBackend.sdpa"})


def test_a_published_row_whose_recipe_states_a_backend_is_priced_with_it_or_says_why_not():
    """validate: AttnBackend.unfused in a row's recipe slows its projection; local (not priced) is dropped from the
    row, listed as ignored with the refusal, and the row projects as with auto."""
    from oracle.validate import validate_rows
    base = {"id": "r", "source": "test", "group": "25.11 NeMo / x", "model": "llama3.1-8b", "hardware": "h100-sxm",
            "num_gpus": "8", "seq_len": "8192", "gbs": "64", "mbs": "1", "tp": "1", "pp": "1", "vpp": "1", "cp": "1",
            "ep": "1", "etp": "", "precision": "bf16", "fsdp": "false", "use_distributed_optimizer": "true",
            "recompute": "selective", "recompute_num_layers": "", "pp_schedule": "", "moe_a2a_backend": "",
            "measured_tokens_per_s_per_gpu": "8000", "measured_tflops_per_gpu": "", "measured_peak_mem_gib": "",
            "quality": "A", "notes": "", "recipe_source": ""}
    rows = [dict(base, id=k, recipe=v) for k, v in (("auto", "attention_backend=AttnBackend.auto"),
                                                    ("unfused", "attention_backend=AttnBackend.unfused"),
                                                    ("local", "attention_backend=AttnBackend.local"))]
    auto, unfused, local = validate_rows(rows)
    assert unfused.projected < auto.projected and local.projected == auto.projected
    assert any(e.startswith("attention_backend=local (illegal with the row's other settings: "
                            "attention_backend=local is Megatron-Core's own attention") for e in local.recipe_ignored)


def test_fp8_attention_with_softmax_sinks_needs_blackwell():
    """Transformer Engine has no FP8 attention backend for learnable softmax sinks before compute capability 10.0
    (TE 2.20 get_attention_backend: FlashAttention never takes sinks, the unfused path never FP8, the fused one
    only on sm >= 100 with cuDNN >= 9.21)."""
    spec = {"model": "gpt-oss-120b", "training": {"seq_len": 4096, "gbs": 256, "ep": 8, "precision": "fp8",
                                                    "fp8_dot_product_attention": True}}
    with pytest.raises(InvalidConfigError, match="learnable softmax sinks: Transformer Engine has an FP8 attention"):
        RunConfig.from_dict({**spec, "cluster": {"hardware": "h100-sxm", "num_gpus": 64}})
    assert RunConfig.from_dict({**spec, "cluster": {"hardware": "b200", "num_gpus": 64}}).training.fp8_dot_product_attention
    llama = {**spec, "model": "llama3.1-8b", "training": {**spec["training"], "ep": 1}}
    assert RunConfig.from_dict({**llama, "cluster": {"hardware": "h100-sxm", "num_gpus": 64}})  # no sinks: FP8 attention


def test_fp8_attention_needs_a_scaling_recipe_transformer_engine_runs_it_with():
    """TE get_attention_backend in FP8 training leaves only the fused backend, which takes per-tensor current scaling
    only on compute capability 10.x (TE 2.8-2.20) and no FP8 block scaling (TE 2.20)."""
    def run(hardware, recipe):
        return RunConfig.from_dict({"model": "llama3.1-8b", "cluster": {"hardware": hardware, "num_gpus": 8},
                                    "training": {"seq_len": 8192, "gbs": 64, "precision": "fp8", "fp8_recipe": recipe,
                                                 "fp8_dot_product_attention": True}})
    assert run("h100-sxm", "delayed") and run("b200", "tensorwise") and run("b200", "mxfp8")
    with pytest.raises(InvalidConfigError, match="takes current scaling only on Blackwell"):
        run("h100-sxm", "tensorwise")
    for hw in ("h100-sxm", "b200"):
        with pytest.raises(InvalidConfigError, match="no FP8 attention backend for FP8 block scaling"):
            run(hw, "blockwise")
