"""One decoder layer (and the embedding / output head) as a list of ops: the one description of a layer
that simulate timing prices (oracle.compute), the FLOP count checks against (oracle.flops), memory sums
the saved activations of (oracle.activations) and benchmark mode names its measurements by.

An op is what one rank runs for one micro-batch: a GEMM [m x k] @ [k x n] (``groups`` of them for the
grouped expert GEMMs), the flash-attention core, or a memory-bound kernel group (norms, RoPE, residual
adds, activations, permutes, FP8/FP4 quantise casts) with the bytes it moves. Each op also says how
many framework-level operations the host issues for it (``host_ops``: Python/autograd calls of
Megatron-Core + Transformer Engine, each costing the profile's ``efficiency.host_op_s``) and how many
extra device launches a C++ loop issues (``loop_launches``: Transformer Engine's GroupedLinear runs one
GEMM per local expert; each costs ``efficiency.kernel_launch_s`` of host time). The host counts are
engineering counts read off Megatron-Core's TransformerLayer / MoELayer with TE modules (core 0.12-0.14):
they set the *shape* of the host cost (MoE layers issue ~3x a dense layer's ops, expert loops scale with
the local experts); its *scale* is the fitted ``host_op_s`` of each GPU generation (docs/kernel-model.md).

Each op also lists the tensors autograd keeps for its backward (``saved``), as Megatron-Core with TE
keeps them, each tagged with the cheapest recompute mode that drops it (docs/memory.md Sec. 3).

Shapes follow Megatron-Core: T = mbs*seq/cp tokens per rank; TP-split GEMMs see all T tokens
(sequence-parallel regions are gathered first), norms/residuals see T/tp with SP.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import ceil
from typing import Any, Literal, get_args

from oracle.dataclass_copy import HashedOnce, fast_init, replace_fast, slot_setter
from oracle.model_card import MOE_KINDS

BF16 = 2
FP32 = 4
FP8 = 1
INT64 = 8
MASK = 1
"""torch.bool dropout mask / routing map: 1 B per element."""

GEMM, ATTENTION, MEMORY, SSD, GDN = "gemm", "attention", "memory", "ssd", "gdn"
ATTN, MLP, ROUTER, EXPERTS, MAMBA = "attn", "mlp", "router", "moe", "mamba"
"""Blocks of a decoder layer (``Op.block``): the attention block (input norm to residual add), a dense MLP
block (norm to residual add), a MoE block split into its router (pre-MLP norm, router GEMM, top-k and
token counts: what runs before the dispatcher's sync) and the rest (dispatch, experts, shared experts,
residual add), and a hybrid model's Mamba-2 mixer layer (norm to residual add)."""
ROUTER_OPS = frozenset({"mlp_norm", "router", "router_topk", "router_capacity", "latent_down"})
PRE_SYNC, POST_SYNC = 0, 1
"""Forward segments of an MoE layer: ops before / after the dispatcher's device-to-host sync."""
SELECTIVE, FULL, KEPT = "selective", "full", "kept"
"""Recompute tags of a saved tensor: dropped by selective (core attention, Megatron recompute_modules=
['core_attn']) and full recompute; dropped by full recompute only; kept even then (the layer input,
the full-recompute checkpoint)."""
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                        "fused_group_mlp"]
"""Megatron-Core fine-grained activation offloading's module names (TransformerConfig.offload_modules)."""
"""A Megatron-LM ``--recompute-modules`` value (megatron/core/transformer/transformer_config.py); what
each drops and replays on this graph: oracle.activations.RECOMPUTE_REGIONS."""
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)
"""Megatron's default recompute_modules with --recompute-granularity selective."""
AttentionBackend = Literal["auto", "flash", "fused", "unfused", "local"]
"""A Megatron-Core ``--attention-backend`` value (AttnBackend, megatron/core/transformer/enums.py, in its enum's
order after auto); unfused attention's ops: :func:`attention_ops`."""
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor an op keeps for its backward pass (bytes per micro-batch on this rank)."""

    name: str
    bytes: float
    dropped_by: str = FULL
    """Cheapest recompute mode that drops it: ``selective`` | ``full`` | ``kept`` (never dropped)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes", float(self.bytes))  # int token counts x int sizes: keep bytes a float


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One op of one micro-batch on one rank."""

    name: str
    """Stable op name (``qkv``, ``attn_core``, ``experts_up`` ...): benchmark mode keys its timings by it."""
    kind: str
    """``gemm`` | ``attention`` | ``memory`` | ``ssd`` (a Mamba-2 layer's fused conv1d + chunked state-space scan:
    ``batch_heads`` mbs x local heads, ``s_q`` tokens per sequence on this rank, ``d_v`` the head dim P,
    ``state`` N, ``state_groups`` mbs x local B/C groups, ``chunk`` Q, ``bytes_f`` / ``kernels`` its traffic) |
    ``gdn`` (a Gated DeltaNet layer's chunked gated delta rule: ``batch_heads`` mbs x local value heads, ``s_q``
    tokens per sequence on this rank, ``d_qk`` / ``d_v`` the key / value head dims, ``chunk`` its length,
    ``bytes_f`` / ``kernels`` its traffic)."""
    m: int = 0
    """GEMM rows (tokens) of ONE group."""
    n: int = 0
    """GEMM output columns."""
    k: int = 0
    """GEMM reduction length."""
    groups: int = 1
    """Independent GEMMs of the same shape (local experts)."""
    fused_groups: bool = False
    """The groups run as one kernel (torch._grouped_mm) instead of one GEMM each on 4 streams (TE)."""
    calls: tuple[float, ...] = ()
    """Shares of ``n`` that separate matmul calls compute (TorchTitan's wq/wk/wv, w1/w3); empty: one call.
    Op-level selective checkpointing saves every other call's output (oracle.activations.op_sac_plan)."""
    dtype: str = "bf16"
    """GEMM input precision: bf16 | fp8 | fp4."""
    has_wgrad: bool = True
    """The GEMM has a trainable weight (a weight-gradient GEMM in backward)."""
    wgrad_c_bytes: float = BF16
    """HBM bytes per weight-gradient element the wgrad GEMM moves (Shapes.wgrad_c_bytes)."""
    batch_heads: int = 0
    """Attention: mbs x local query heads."""
    s_q: int = 0
    """Attention: queries per head on this rank."""
    s_k: float = 0.0
    """Attention: average keys per query (causal ~ s/2, window w)."""
    d_qk: int = 0
    """Attention: Q/K head dim."""
    d_v: int = 0
    """Attention: V head dim."""
    seq: int = 0
    """Attention: the sequence length the keys come from (the tile model counts the key blocks each query block
    visits over it)."""
    window: int | None = None
    """Attention: sliding window in tokens (None = full causal)."""
    softmax: str = ""
    """Attention: '' a tiled fused kernel (FlashAttention, cuDNN); unfused attention's softmax over the
    materialised scores: 'kernel' (Transformer Engine's fused scale-mask-softmax kernel) or 'torch' (PyTorch's
    softmax in fp32: an arbitrary mask, a sliding window, or keys past the kernel's limit), UNFUSED_SOFTMAX."""
    state: int = 0
    """SSD: state size N per head."""
    state_groups: int = 0
    """SSD: mbs x the B/C groups on this rank."""
    chunk: int = 0
    """SSD: chunk length Q."""
    bytes_f: float = 0.0
    """Memory-bound op: bytes read + written in forward (backward moves ~2x)."""
    kernels: int = 1
    """Device kernels the op launches in forward (memory-bound ops: each costs at least a launch gap)."""
    host_ops: int = 1
    """Framework-level operations the host issues in forward (the backward issues as many autograd nodes)."""
    loop_launches: int = 0
    """Extra launches issued from a C++ loop in forward (per-expert GEMMs); backward issues 2x."""
    segment: int = PRE_SYNC
    """Forward segment relative to the MoE dispatcher's device-to-host sync."""
    block: str = ""
    """The part of the decoder layer the op belongs to (ATTN, MLP, ROUTER, EXPERTS): what a CUDA graph scope captures
    (oracle.cuda_graphs). Empty for the embedding and the output head."""
    saved: tuple[Saved, ...] = ()
    """Tensors kept for backward (oracle.activations sums them per layer, module and recompute mode)."""

    @property
    def saved_bytes(self) -> float:
        """Bytes this op keeps for backward without recompute."""
        return sum(t.bytes for t in self.saved)

    @property
    def flops_f(self) -> float:
        """Forward FLOPs actually executed (attention: causal average keys, QK^T and PV)."""
        if self.kind == GEMM:
            return 2.0 * self.groups * self.m * self.n * self.k
        if self.kind == ATTENTION:
            return 2.0 * self.batch_heads * self.s_q * self.s_k * (self.d_qk + self.d_v)
        if self.kind == SSD:
            return sum(2.0 * g * m * n * k for m, n, k, g in ssd_matmuls(self))
        if self.kind == GDN:
            return sum(2.0 * g * m * n * k for m, n, k, g in gdn_matmuls(self))
        return 0.0


def ssd_matmuls(op: Op) -> tuple[tuple[int, int, int, int], ...]:
    """The chunked matmuls of Mamba-2's SSD forward as (m, n, k, groups), one group per (chunk, head) or (chunk,
    B/C group) (Dao & Gu 2024, "Transformers are SSMs", Sec. 6; mamba_ssm ssd_combined: bmm_chunk_fwd C B^T per
    chunk and group, chunk_state_fwd B^T X per chunk and head, chunk_scan_fwd (C B^T o L) X + C h_prev per chunk
    and head)."""
    q, n_state, p = op.chunk, op.state, op.d_v
    chunks = -(-op.s_q // q)
    return ((q, q, n_state, chunks * op.state_groups),
            (n_state, p, q, chunks * op.batch_heads),
            (q, p, q + n_state, chunks * op.batch_heads))


GDN_CHUNK = 64
"""Chunk length of the chunked gated delta rule (flash-linear-attention ``chunk_gated_delta_rule``, which
Megatron-Core GatedDeltaNet calls: its kernels tile the sequence in chunks of 64 tokens)."""


@dataclass(frozen=True, slots=True)
class GdnKernel:
    """One kernel of the chunked gated delta rule's forward: its matmuls as (m, n, k) per (chunk, value head), and
    the HBM bytes it reads and writes per (token, value head)."""

    name: str
    matmuls: tuple[tuple[int, int, int], ...]
    bytes_per_token_head: float
    recurrent: bool = False
    """Walks the chunks in order (the state recurrence): one thread block per (head, state columns) for the whole
    sequence."""
    recomputed: bool = False
    """The backward runs it again instead of keeping its output (W, U and the states: flash-linear-attention
    ``chunk_gated_delta_rule_bwd``)."""


@lru_cache(maxsize=64)
def gdn_kernels(dk: int, dv: int, c: int) -> tuple[GdnKernel, ...]:
    """The forward kernels of the chunked gated delta rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks",
    Sec. 3.3, the WY representation; flash-linear-attention ``chunk_gated_delta_rule_fwd``), with key / value head
    dims dk / dv and chunk c: the gate's chunk cumsum (fp32); beta K K^T (chunk_scaled_dot_kkt, A written in fp32);
    the inverse of the unit lower-triangular (I + A) (solve_tril: ~C^3/3 multiply-adds, a C x C x C/3 matmul's;
    A read in fp32, written in bf16); W = A beta K exp(g) and U = A beta V (recompute_w_u); the state recurrence
    v_new = U - W h, h = h exp(g) + K^T v_new, sequential over the chunks (chunk_gated_delta_rule_fwd_h, a bf16
    (dk x dv) state written per chunk); the output Q h exp(g) + (Q K^T o M) v_new (chunk_fwd_o)."""
    state = BF16 * dk * dv / c  # one state per chunk and head, per token of the chunk
    return (GdnKernel("cumsum", (), 2 * FP32),
            GdnKernel("kkt", ((c, c, dk),), BF16 * (dk + 1) + FP32 * (1 + c)),
            GdnKernel("solve_tril", ((c, c, max(1, c // 3)),), FP32 * c + BF16 * c),
            GdnKernel("w_u", ((c, dk, c), (c, dv, c)), BF16 * (c + dk + dv + 1 + dk + dv) + FP32, recomputed=True),
            GdnKernel("state", ((c, dv, dk), (dk, dv, c)), BF16 * (2 * dk + 2 * dv) + FP32 + state, recurrent=True,
                      recomputed=True),
            GdnKernel("output", ((c, dv, dk), (c, c, dk), (c, dv, c)), BF16 * (2 * dk + 2 * dv) + FP32 + state))


def gdn_matmuls(op: Op) -> tuple[tuple[int, int, int, int], ...]:
    """Every matmul of the rule's forward (:func:`gdn_kernels`) as (m, n, k, groups), one group per (chunk, value
    head)."""
    g = -(-op.s_q // op.chunk) * op.batch_heads
    return tuple((m, n, k, g) for kern in gdn_kernels(op.d_qk, op.d_v, op.chunk) for m, n, k in kern.matmuls)


def avg_keys(seq: int, window: int | None) -> float:
    """Average keys per query under a causal mask, optionally within a sliding window."""
    if window is None or window >= seq:
        return (seq + 1) / 2.0
    return (window * (window + 1) / 2.0 + (seq - window) * window) / seq


@dataclass(frozen=True, slots=True, kw_only=True)
class Shapes(HashedOnce):
    """The per-rank sizes every op builder needs (from a RunConfig)."""

    T: int
    """Tokens per micro-batch on this rank (mbs*seq/cp)."""
    T_sp: int
    """Tokens in sequence-parallel regions (T/tp with SP)."""
    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    seq_len: int
    dtype: str
    """Decoder-layer GEMM kernel class: bf16 | fp8 | mxfp8 | fp4 (TrainingConfig.gemm_kernel)."""
    fp8_recipe: str = "delayed"
    """FP8 scaling recipe (TrainingConfig.fp8_recipe): what the quantise casts move (CAST_BYTES)."""
    moe_load: float = 1.0
    """Busiest expert's pairs over the mean (TrainingConfig.moe_load: imbalance, capped or padded by the
    capacity factor)."""
    paged_stash: bool = False
    """The routed experts' saved activations are copied into a paged stash and back (TrainingConfig.moe_paged_stash)."""
    buffer_load: float = 1.0
    """Saved tensors only: what the experts' saved activations are sized for over the balanced share
    (TrainingConfig.moe_buffer_load: the paged stash's factor, HybridEP's static budget, else moe_load)."""
    capacity_factor: float | None = None
    """Token-drop MoE: the router also keeps each expert's top-capacity tokens (TrainingConfig)."""
    saved_gemm_bytes: float = BF16
    """Bytes per saved GEMM input: the quantised copy TE keeps under an FP8/FP4 recipe (saved_input_bytes), else
    bf16."""
    act_input_bytes: float = BF16
    """Bytes per saved MLP activation input (the FC1 output): 1 with fp8_activations (Megatron-Core
    ``activation_func_fp8_input_store``), else bf16."""
    flash_attention: bool = True
    """Saved tensors only (oracle.activations.MemoryAssumptions): fused attention keeps a logsumexp,
    not the a x s x s softmax."""
    dropout: bool = False
    """Saved tensors only: dropout keeps masks (K22)."""
    router_saved_bytes: int = FP32
    """Saved tensors only: router logits / probabilities in fp32 (Megatron moe_router_dtype=fp32)."""
    framework: str = "megatron"
    """Whose kernels run the layer: megatron (Transformer Engine) | torchtitan (PyTorch modules)."""
    compiled: bool = False
    """torchtitan: torch.compile fuses each block's elementwise ops (as TE's fused kernels do)."""
    router_fusion: bool = False
    """The router's score function, top-k and aux-loss statistics run fused (TrainingConfig.moe_router_fusion)."""
    fused_mlp: bool = False
    """The routed experts' MLP is one fused grouped kernel (TrainingConfig.fused_grouped_mlp where Transformer Engine
    runs its CuTe DSL grouped MLP: :func:`cutedsl_grouped_mlp`)."""
    attention_dtype: str = "bf16"
    """Precision of the attention core's matmuls: bf16, or fp8 (TrainingConfig.fp8_dot_product_attention)."""
    unfused_attention: bool = False
    """The attention core materialises its scores (TrainingConfig.attention_backend=unfused): batched GEMMs over
    the full square, a softmax pass in HBM, the probabilities kept for backward."""
    output_dtype: str = "bf16"
    """Precision of the LM head's logits GEMM: bf16, or mxfp8 (TrainingConfig.fp8_output_proj)."""
    wgrad_c_bytes: float = 2 * BF16
    """HBM bytes per weight element a weight-gradient GEMM moves: Megatron-Core's gradient-accumulation
    fusion (TE ``fuse_wgrad_accumulation``, on by default) has the wgrad GEMM accumulate into the
    main-gradient buffer (C = A B + C), reading and writing it every micro-batch: 2 x its dtype (bf16
    4 B, fp32 with grad_reduce_in_fp32 8 B). TorchTitan's autograd writes a bf16 gradient (2 B) that
    FSDP2 reduce-scatters. Short reductions (few tokens per expert) make the wgrad GEMM bound by this
    traffic, not by its FLOPs."""

    dispatcher: str = "alltoall"
    """MoE token dispatcher (TrainingConfig.moe_a2a_backend): what the permute passes around the exchange move
    (``_permute_op``)."""
    _hash: int = field(init=False, repr=False, compare=False)
    """The fields' hash, once (:class:`~oracle.dataclass_copy.HashedOnce`: shapes key the op-graph caches)."""

    __hash__ = HashedOnce.__hash__
    __getstate__ = HashedOnce.__getstate__
    __setstate__ = HashedOnce.__setstate__

    @property
    def eager(self) -> bool:
        """Elementwise ops run as PyTorch's eager composite kernels (TorchTitan without torch.compile)."""
        return self.framework == "torchtitan" and not self.compiled

    @classmethod
    def of(cls, run, **saved_tensor_assumptions: Any) -> "Shapes":
        """The shapes of ``run``; keywords set the saved-tensor fields (flash_attention, dropout,
        router_saved_bytes) instead of their defaults. One instance is shared by every run whose field values are
        equal (it is immutable, and equal shapes already share every cache keyed on them, ``_op_sums`` included)."""
        t = run.training
        T = t.mbs * t.seq_len // t.cp
        titan = t.framework == "torchtitan"
        # gradient-accumulation fusion: the wgrad GEMM reads and writes the main-gradient buffer; without it
        # (and under TorchTitan) it writes a bf16 gradient, accumulated by a separate kernel (oracle.compute)
        fused_acc = t.gradient_accumulation_fusion and not titan
        values = (T, T // t.tp if t.sp else T, t.tp, t.cp, t.ep, t.etp, t.mbs, t.seq_len, t.gemm_kernel,
                  t.fp8_recipe, t.moe_load, t.moe_expert_capacity_factor, t.moe_buffer_load, t.moe_paged_stash,
                  saved_input_bytes(t), FP8 if t.fp8_activations else BF16, t.framework, t.torch_compile,
                  2 * (FP32 if t.grad_reduce_in_fp32 else BF16) if fused_acc else BF16, t.moe_router_fusion,
                  cutedsl_grouped_mlp(run), "fp8" if t.fp8_dot_product_attention else "bf16",
                  "mxfp8" if t.fp8_output_proj else "bf16", t.moe_a2a_backend, t.attention_backend == "unfused")
        key = (cls, values, tuple(saved_tensor_assumptions.items()))
        hit = _SHAPES.get(key)
        if hit is None:
            if len(_SHAPES) > 4096:
                _SHAPES.clear()
            hit = _SHAPES[key] = cls(**dict(zip(_OF_FIELDS, values)), **saved_tensor_assumptions)
        return hit


def cutedsl_grouped_mlp(run) -> bool:
    """Transformer Engine's CuTe DSL grouped MLP runs the routed experts (TrainingConfig.fused_grouped_mlp): the op
    fuser fuses FC1, the activation and FC2 only for a GLU expert MLP (Megatron-Core ``_is_fused_impl_supported``'s
    SwiGLU / quick-GEGLU; its squared-ReLU path keeps the unfused kernels), on compute capability 10.x
    (``is_supported``) and on MXFP8 or NVFP4 inputs (``fuse_grouped_mlp_ops``; TE 2.20 ops/fused/grouped_mlp.py).
    Elsewhere the op fuser runs the same grouped GEMMs and activation as the unfused path, reading its token counts on
    the device."""
    t = run.training
    return (t.fused_grouped_mlp and run.model.gated and run.cluster.hardware.sm100_class
            and (t.precision == "nvfp4" or (t.precision == "fp8" and t.fp8_recipe == "mxfp8")))


_OF_FIELDS = ("T", "T_sp", "tp", "cp", "ep", "etp", "mbs", "seq_len", "dtype", "fp8_recipe", "moe_load",
              "capacity_factor", "buffer_load", "paged_stash", "saved_gemm_bytes", "act_input_bytes", "framework",
              "compiled", "wgrad_c_bytes", "router_fusion", "fused_mlp", "attention_dtype", "output_dtype",
              "dispatcher", "unfused_attention")
"""The :class:`Shapes` fields :meth:`Shapes.of` sets from a run, in the order of its values."""
_SHAPES: dict[tuple, Shapes] = {}
""":meth:`Shapes.of`'s instances by (class, the field values it computed, the saved-tensor keywords)."""


QUANTISED_INPUT_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "fp4": 0.5 + 1.0 / 16}
"""Bytes per value of a GEMM input Transformer Engine keeps for the weight gradient under an FP8/FP4 recipe: the
column-wise quantised copy the forward made (per-tensor FP8 1 B; MXFP8 + an e8m0 scale per 32; NVFP4 0.5 B +
an fp8 scale per 16), not the bf16 tensor (TE Linear / GroupedLinear save their quantised inputs; blockwise FP8
adds an fp32 scale per 128)."""


def saved_input_bytes(t) -> float:
    """What one saved GEMM-input value costs under ``t``'s recipe (Megatron + TE: the quantised copy; TorchTitan's
    float8 converters save the bf16 input and re-cast it in the backward)."""
    if t.framework != "megatron" or t.gemm_kernel == "bf16":
        return BF16
    if t.gemm_kernel == "fp8" and t.fp8_recipe == "blockwise":
        return 1.0 + 4.0 / 128
    return QUANTISED_INPUT_BYTES[t.gemm_kernel]


def kv_heads_per_rank(card, tp: int) -> float:
    """KV heads on one TP rank; with tp > g Megatron replicates one group per rank."""
    g = card.kv_heads
    return g / tp if g >= tp else 1.0


def qkv_gather_bytes(card, s: Shapes) -> float:
    """Bytes of the fused QKV output Megatron-Core all-gathers over TP in every layer when the model has fewer
    query groups than TP ranks (its backward reduce-scatters them): the QKV linear is split evenly over TP, so a
    rank's output columns do not hold whole heads, and each rank gathers the whole output and slices out its group
    (``SelfAttention.get_query_key_value_tensors``, Megatron-Core 0.19); 0 otherwise (TorchTitan refuses the
    layout, MLA has no fused QKV)."""
    if card.attention == "mla" or card.kv_heads >= s.tp or s.framework != "megatron":
        return 0.0
    return BF16 * s.T * card.qkv_width


def _dropout_mask(s: Shapes, hidden: int) -> tuple[Saved, ...]:
    # bias-dropout-add keeps only the dropout mask (K22 "dropout mask: sbh"); the add saves nothing
    return (Saved("dropout_mask", s.T_sp * hidden * MASK),) if s.dropout else ()


def _core_attention_saved(card, s: Shapes, q_w: float, k_w: float, v_w: float,
                          softmax: str = "") -> tuple[Saved, ...]:
    """Q, K, V kept by core attention (K22 "QK^T: 4sbh", "V: 2sbh") and its softmax statistics (a fused kernel),
    or its probabilities (the score matrix: unfused attention, or the K22 accounting without flash attention)."""
    T, a_r = s.T, card.num_attention_heads / s.tp
    t = [Saved("q", T * q_w * BF16), Saved("k", T * k_w * BF16), Saved("v", T * v_w * BF16)]
    if s.flash_attention and not softmax:
        # flash attention keeps an fp32 logsumexp per (head, token) (TE softmax_lse, b x a/tp x s/cp)
        t.append(Saved("softmax_lse", a_r * T * FP32, SELECTIVE))
    else:
        scores = a_r * T * s.seq_len  # (a/tp) x b x (s/cp) x s score matrix
        # K22 "softmax output: 2as^2b"; unfused attention's softmax path keeps what UNFUSED_SOFTMAX says
        per_score = UNFUSED_SOFTMAX[softmax].saved_bytes if softmax else BF16
        t.append(Saved("softmax_output", scores * per_score, SELECTIVE))
        if s.dropout:  # K22 "softmax dropout mask as^2b" + "dropout output 2as^2b"
            t += [Saved("attn_dropout_mask", scores * MASK, SELECTIVE),
                  Saved("attn_dropout_output", scores * BF16, SELECTIVE)]
    return tuple(t)


@dataclass(frozen=True)
class SoftmaxCost:
    """Unfused attention's softmax over the materialised scores: HBM bytes per score in forward and in backward,
    kernels per pass, and bytes per score kept for backward."""

    fwd_bytes: float
    bwd_bytes: float
    kernels: int
    saved_bytes: float


UNFUSED_SOFTMAX: dict[str, SoftmaxCost] = {
    # Transformer Engine FusedScaleMaskSoftmax's CUDA kernels (scaled_upper_triang_masked_softmax): read the bf16
    # scores, write bf16 probabilities (fp32 inside); backward reads probabilities and their gradient, writes one
    # gradient; the probabilities are both the softmax's saved output and the PV matmul's input (one tensor)
    "kernel": SoftmaxCost(fwd_bytes=2 + 2, bwd_bytes=2 + 2 + 2, kernels=1, saved_bytes=BF16),
    # its PyTorch fallback (forward_torch_softmax, attention_softmax_in_fp32): float() 2+4, masked_fill 4+1+4,
    # Softmax 4+4, to(bf16) 4+2; autograd runs each backward (6, 9, 12, 6); Softmax keeps its fp32 output and the
    # PV matmul the bf16 copy
    "torch": SoftmaxCost(fwd_bytes=6 + 9 + 8 + 6, bwd_bytes=6 + 9 + 12 + 6, kernels=4, saved_bytes=FP32 + BF16),
}
"""Softmax costs of unfused attention by path (Op.softmax)."""
FUSED_SOFTMAX_MAX_KEYS = 16384
"""Transformer Engine FusedScaleMaskSoftmax.is_kernel_available: 16 < keys < 16384, keys a multiple of 8, query
heads x batch a multiple of 4, a causal (not arbitrary) mask."""


def _unfused_softmax(card, s: Shapes, window: int | None) -> str:
    """Which softmax unfused attention runs (Transformer Engine UnfusedDotProductAttention): its fused kernel for
    a plain causal mask within the kernel's sizes, else PyTorch's (a sliding window is an arbitrary mask; learnable
    softmax sinks add a column the kernel does not take)."""
    sk, heads = s.seq_len, s.mbs * (card.num_attention_heads // s.tp)
    if window is not None or card.attention_sinks or not 16 < sk < FUSED_SOFTMAX_MAX_KEYS or sk % 8 or heads % 4:
        return "torch"
    return "kernel"


CAST_BYTES = {"delayed": 3.0, "tensorwise": 3.0, "mxfp8": 2.0 + 2 * (1.0 + 1.0 / 32), "blockwise": 2.0 + 2 * (1.0 + 4.0 / 128)}
"""Quantise traffic per FP8 GEMM input element by recipe (Transformer Engine's quantizers): delayed and
tensorwise read bf16 and write fp8 (2 + 1): the scale comes from the amax history, or, with current
scaling, from the amax the producing kernel (TE's fused norms and activations, the GEMM epilogue) reduced
while writing the tensor; mxfp8 and blockwise read once and write row-wise and column-wise copies with
their scales (MXFP8: e8m0 per 32 values; blockwise: fp32 per 128), 2 + 2 x (1 + scale)."""


def _cast_bytes(s: Shapes, elems: float) -> float:
    """Quantise-cast traffic for low-precision GEMM inputs: read bf16, write fp8/fp4 (+scales)."""
    if s.dtype == "fp4":
        return 2.5 * elems + elems / 16  # bf16 read, 0.5 B write, one fp8 scale per 16 (NVFP4)
    if s.dtype == "mxfp8":
        return CAST_BYTES["mxfp8"] * elems
    if s.dtype == "fp8":
        # TorchTitan's torchao float8 casts are priced by their own kernels (_quant_op's eager factor)
        recipe = s.fp8_recipe if s.framework == "megatron" else "delayed"
        return CAST_BYTES[recipe] * elems
    return 0.0


# TorchTitan's eager kernels (PyTorch composite ops as torchtitan/models/llama3/model.py calls them), forward
# bytes read + written per element; a memory-bound op's backward moves ~2x (oracle.compute.price_op).
EAGER_RMSNORM_BYTES = 36
"""F.rms_norm's composite: to(fp32) 2+4, pow 4+4, mean 4, x*rsqrt 4+4, type_as 4+2, *weight 2+2 (fused: 2+2)."""
EAGER_RMSNORM_KERNELS = 8
EAGER_RMSNORM_SAVED_EXTRA = FP32
"""pow/mul keep the fp32 upcast (4 B) and mul(weight) the bf16 result (2 B): 6 B per element where a fused
norm keeps its 2 B input; the 4 B beyond the input."""
EAGER_ROPE_BYTES = 20
"""apply_rotary_emb per q/k element: float() 2+4, complex multiply 4+4, type_as 4+2 (fused: 2+2)."""
EAGER_SWIGLU_BYTES = 10
"""silu(w1 x) * w3 x per FFN element: silu 2+2, multiply 2+2+2 (fused SwiGLU: 2+2+2 = 6)."""
EAGER_CAST_FACTOR = 5.0 / 3.0
"""torchao float8 dynamic scaling casts each GEMM input with an amax pass (read 2) and a cast (2+1): 5 B
per element against the 3 B of TE's fused amax-and-cast."""
EAGER_LOSS_BYTES = 18
"""TorchTitan's cross_entropy_loss per logit: pred.float() 2+4, log_softmax's max and sum-exp passes and
write 4+4+4 (fused vocab-parallel cross entropy: 2+2)."""


def _norm_bytes_kernels(s: Shapes, elems: float) -> tuple[float, int]:
    """A norm's forward bytes and kernels: fused (TE, or compiled) or PyTorch's eager composite."""
    return (EAGER_RMSNORM_BYTES * elems, EAGER_RMSNORM_KERNELS) if s.eager else (BF16 * 2 * elems, 1)


def attention_ops(card, s: Shapes, window: int | None) -> list[Op]:
    """Input norm, QKV (or MLA projections), RoPE, core attention, output projection, residual."""
    H, tp, T, Tsp, dt, b_g = card.hidden_size, s.tp, s.T, s.T_sp, s.dtype, s.saved_gemm_bytes
    a_r = card.num_attention_heads / tp
    # norm input = the layer input, sequence-sharded under SP (K22 "LayerNorm: 2sbh"); full recompute
    # keeps it as the checkpoint (paper B.1: MBS x S/(TP*CP) x H, bf16)
    ops: list[Op] = [_norm_op(card, s, "attn_norm", KEPT)]
    # QKV / down-projection GEMM input = norm output (K22 "QKV input 2sbh"; SP keeps it sequence-sharded)
    qkv_in = (Saved("qkv_input", Tsp * H * b_g),)
    qk_norm_saved: tuple[Saved, ...] = ()
    if card.attention == "mla":
        rope = card.qk_rope_head_dim or 0
        ql, kvl = card.q_lora_rank, card.kv_lora_rank or 0
        if ql:  # q_norm input and q_up GEMM input (Megatron MLA, down-projection on the SP shard)
            ops += [Op(name="q_down", kind=GEMM, m=T, n=ql, k=H, dtype=dt, host_ops=2, saved=qkv_in),
                    Op(name="q_up", kind=GEMM, m=T, n=card.q_width // tp, k=ql, dtype=dt, host_ops=2,
                       saved=(Saved("q_latent", Tsp * ql * BF16), Saved("q_up_input", Tsp * ql * b_g)))]
        else:
            ops.append(Op(name="q_proj", kind=GEMM, m=T, n=card.q_width // tp, k=H, dtype=dt, host_ops=2, saved=qkv_in))
        ops += [Op(name="kv_down", kind=GEMM, m=T, n=card.kv_lora_rank + rope, k=H, dtype=dt, host_ops=2),
                Op(name="kv_up", kind=GEMM, m=T, n=card.kv_width // tp, k=card.kv_lora_rank, dtype=dt, host_ops=2,
                   saved=(Saved("kv_latent", Tsp * kvl * BF16), Saved("kv_up_input", Tsp * kvl * b_g)))]
        d_qk, d_v = (card.qk_nope_head_dim or 0) + rope, card.v_head_dim or 0
        qk_elems = T * card.q_width / tp
        in_elems = T * H * 2 + T * (card.q_lora_rank or 0) + T * card.kv_lora_rank
        q_w = k_w = a_r * d_qk  # up-projected Q and K (rope part broadcast to every head)
        v_w = ctx_w = a_r * d_v
        # MLA's qk_layernorm is the latent norms: their inputs are saved by q_up / kv_up above
    else:
        qkv_n = card.qkv_width // tp
        ops.append(Op(name="qkv", kind=GEMM, m=T, n=qkv_n, k=H, dtype=dt, host_ops=2, saved=qkv_in))
        d_qk = d_v = card.head_size
        in_elems = T * H
        q_w = ctx_w = a_r * d_qk
        k_w = v_w = kv_heads_per_rank(card, tp) * d_qk
        # q/k norms and RoPE over the heads a rank attends with: with fewer KV heads than TP ranks, one K head each
        qk_elems = T * (q_w + k_w)
        # per-head q/k norm inputs (Qwen3)
        qk_norm_saved = (Saved("q_norm_input", T * q_w * BF16), Saved("k_norm_input", T * k_w * BF16))
    titan = s.framework == "torchtitan"
    if titan and card.attention != "mla":  # separate wq / wk / wv linears: one GEMM op, three calls on the host
        qkv = ops[-1]
        kv_share = k_w / (q_w + 2 * k_w)
        ops[-1] = replace(qkv, host_ops=6, calls=(1 - 2 * kv_share, kv_share, kv_share))
    if card.qk_layernorm:
        nb, nk = _norm_bytes_kernels(s, qk_elems)
        extra = tuple(Saved(f"{x.name}_fp32", x.bytes / BF16 * EAGER_RMSNORM_SAVED_EXTRA) for x in qk_norm_saved)
        ops.append(Op(name="qk_norm", kind=MEMORY, bytes_f=nb, kernels=2 * nk, host_ops=2 * nk,
                      saved=qk_norm_saved + (extra if s.eager else ())))
    if card.position_embedding == "rope" or card.attention == "mla":  # learned / no positions: no rotary kernel
        rope_b = EAGER_ROPE_BYTES * qk_elems if s.eager else BF16 * 2 * qk_elems
        ops.append(Op(name="rope", kind=MEMORY, bytes_f=rope_b, kernels=6 if s.eager else 1,
                      host_ops=8 if s.eager else 2))
    unfused = s.unfused_attention
    if (titan or unfused) and card.attention != "mla" and k_w < q_w:
        # torchtitan repeat_kv, Transformer Engine's UnfusedDotProductAttention repeat_interleave: GQA K and V
        # expanded to every query head (a copy) before the attention, which then keeps the repeated K and V for
        # its backward
        ops.append(Op(name="repeat_kv", kind=MEMORY, bytes_f=BF16 * 2 * T * (k_w + q_w), kernels=2, host_ops=4))
        k_w = v_w = q_w
    softmax = _unfused_softmax(card, s, window) if unfused else ""
    batch_heads = s.mbs * (card.num_attention_heads // tp)
    ops.append(Op(name="attn_core", kind=ATTENTION, batch_heads=batch_heads,
                  # unfused: every (query, key) pair of the square is computed, the mask applied after
                  s_q=s.seq_len // s.cp, s_k=float(s.seq_len) if unfused else avg_keys(s.seq_len, window),
                  d_qk=d_qk, d_v=d_v, seq=s.seq_len, window=window, dtype=s.attention_dtype, softmax=softmax,
                  host_ops=2 + UNFUSED_SOFTMAX[softmax].kernels if unfused else 3,
                  saved=_core_attention_saved(card, s, q_w, k_w, v_w, softmax)))
    if card.q_gate_width:
        # gated attention (Megatron-Core SelfAttention._apply_output_gate): the gate copied contiguous out of the
        # QKV output, then context x sigmoid(gate) in fp32 (one fused kernel), which keeps the gate (the context
        # it also keeps is the attention kernel's saved output)
        g_w = a_r * card.head_size
        ops.append(Op(name="attn_gate", kind=MEMORY, bytes_f=BF16 * 5 * T * g_w, kernels=2, host_ops=4,
                      saved=(Saved("gate", T * g_w * BF16),)))
    # output-projection GEMM input (K22 "linear projection: 2sbh")
    ops.append(Op(name="attn_out", kind=GEMM, m=T, n=H, k=card.attn_out_width // tp, dtype=dt, host_ops=2,
                  saved=(Saved("context", T * ctx_w * b_g),)))
    if dt != "bf16":
        ops.append(_quant_op(s, "attn_quant", _cast_bytes(s, in_elems + T * card.attn_out_width / tp), PRE_SYNC))
    ops.append(Op(name="attn_residual", kind=MEMORY, bytes_f=BF16 * 3 * Tsp * H, host_ops=1, saved=_dropout_mask(s, H)))
    return ops


def mlp_ops(card, s: Shapes, ffn: int, tokens: int, prefix: str = "mlp", segment: int = PRE_SYNC,
            saved_input: tuple[Saved, ...] = ()) -> list[Op]:
    """A TP-split (gated) MLP over ``tokens`` gathered tokens: up, activation, down (+ quantise casts).
    ``saved_input``: what the up GEMM keeps of its input (the caller knows whether it is shared)."""
    H, tp, dt = card.hidden_size, s.tp, s.dtype
    up = (2 if card.gated else 1) * ffn // tp
    act_saved, down_saved = _mlp_saved(card, s, tokens, ffn / tp)
    act_b, act_k = _act_bytes_kernels(card, s, tokens * ffn / tp)
    calls = (0.5, 0.5) if card.gated and s.framework == "torchtitan" else ()  # w1 and w3: two linears
    ops = [Op(name=f"{prefix}_up", kind=GEMM, m=tokens, n=up, k=H, dtype=dt, host_ops=2 * len(calls or (1,)),
              segment=segment, calls=calls, saved=saved_input),
           Op(name=f"{prefix}_act", kind=MEMORY, bytes_f=act_b, kernels=act_k, host_ops=act_k, segment=segment,
              saved=act_saved),
           Op(name=f"{prefix}_down", kind=GEMM, m=tokens, n=H, k=ffn // tp, dtype=dt, host_ops=2, segment=segment,
              saved=down_saved)]
    if dt != "bf16":
        ops.append(_quant_op(s, f"{prefix}_quant", _cast_bytes(s, tokens * (H + ffn / tp)), segment))
    return ops


def _quant_op(s: Shapes, name: str, cast_bytes: float, segment: int, loop_launches: int = 0) -> Op:
    """FP8/FP4 casts of a block's GEMM inputs: TE's fused amax-and-cast, or torchao's eager amax + cast."""
    k = 4 if s.eager else 2
    return Op(name=name, kind=MEMORY, bytes_f=cast_bytes * (EAGER_CAST_FACTOR if s.eager else 1.0), kernels=k,
              host_ops=k, loop_launches=loop_launches, segment=segment)


def _act_bytes_kernels(card, s: Shapes, elems: float) -> tuple[float, int]:
    """The MLP activation over ``elems`` FFN elements: fused SwiGLU / GeLU, or eager silu then multiply."""
    if not card.gated:
        return BF16 * 2 * elems, 1
    return (EAGER_SWIGLU_BYTES * elems, 2) if s.eager else (BF16 * 3 * elems, 1)


def _mlp_saved(card, s: Shapes, tokens: float, ffn_r: float) -> tuple[tuple[Saved, ...], tuple[Saved, ...]]:
    """(activation op, down GEMM) saved tensors of an MLP of local width ``ffn_r``: the fc1 output is the
    activation's input (K22 GeLU input 8sbh; SwiGLU keeps gate + up, 2F), bf16 unless Megatron's
    activation_func_fp8_input_store (fp8_activations) keeps it in FP8; the activation output is the fc2 GEMM input
    (K22 "8sbh"), kept as that GEMM keeps its inputs."""
    up = 2 if card.gated else 1
    act: tuple[Saved, ...] = (Saved("fc1_output", tokens * up * ffn_r * s.act_input_bytes),)
    if s.eager and card.gated:  # eager silu(w1 x) * w3 x: the multiply keeps the SiLU output too
        act += (Saved("silu_output", tokens * ffn_r * BF16),)
    return act, (Saved("act_output", tokens * ffn_r * s.saved_gemm_bytes),)


def moe_pairs(card, s: Shapes) -> float:
    """(token, expert) pairs the busiest rank's local experts process per micro-batch (paper Sec. 4.10):
    the SP shard's tokens x top-k x ETP, times the load (imbalance, or the capacity factor's cap / padding)."""
    return s.T_sp * card.moe_topk * s.etp * s.moe_load


def _capacity_ops(s: Shapes, tokens: int, experts: int) -> tuple[Op, ...]:
    """Token-drop MoE: Megatron-Core ``topk_softmax_with_capacity`` keeps each expert's top-capacity
    tokens, a top-k over the tokens of the T x E fp32 probabilities (read twice: top-k, then the gather
    and mask), writing the dropped-token mask: five torch ops (top-k, zeros + scatter of the capacity
    mask, logical_and with the top-k map, the masked probabilities). Dropless routing has no such op."""
    if s.capacity_factor is None:
        return ()
    return (Op(name="router_capacity", kind=MEMORY, bytes_f=(FP32 * 2 + MASK) * tokens * experts, kernels=5,
               host_ops=5),)


ROUTER_FUSED_KERNELS = 2
"""Megatron-Core moe_router_fusion: Transformer Engine's fused_topk_with_score_function (score function, top-k,
normalisation) and fused_compute_score_for_moe_aux_loss, one kernel each; unfused, the same work is ~6 PyTorch
kernels and ~14 framework ops (softmax/sigmoid, topk, gather, division, scatter into the routing map, aux-loss
statistics)."""


def _router_topk_op(s: Shapes, tokens: int, experts: int, saved_bytes: int) -> Op:
    """Score function, top-k, normalisation, aux-loss statistics and per-expert token counts over the T x E
    fp32 logits. Unfused: read the logits, write and re-read the scores (3 passes); fused: read the logits,
    write the probabilities (2 passes) in ROUTER_FUSED_KERNELS kernels."""
    saved = (Saved("router_logits", tokens * experts * saved_bytes), Saved("router_probs", tokens * experts * saved_bytes))
    if s.router_fusion:
        return Op(name="router_topk", kind=MEMORY, bytes_f=FP32 * 2 * tokens * experts, kernels=ROUTER_FUSED_KERNELS,
                  host_ops=2 * ROUTER_FUSED_KERNELS, saved=saved)
    return Op(name="router_topk", kind=MEMORY, bytes_f=FP32 * 3 * tokens * experts, kernels=6, host_ops=14, saved=saved)


def moe_ops(card, s: Shapes) -> list[Op]:
    """Router + top-k, permute, grouped expert GEMMs (busiest rank, paper Sec. 4.10), unpermute, shared
    experts. The dispatcher's device-to-host sync splits the forward after the router."""
    H, dt = card.hidden_size, s.dtype
    W = card.expert_width  # what is dispatched and what the experts take: hidden_size, or a latent MoE's width
    tokens = s.T_sp  # the router and dispatcher work on the sequence-parallel shard
    latent_down, latent_up = _latent_ops(card, s, tokens)
    E_local = card.num_experts // s.ep
    pairs = moe_pairs(card, s)
    m_e = max(1, ceil(pairs / E_local))
    ffn_l = card.expert_ffn // s.etp
    up = (2 if card.gated else 1) * ffn_l
    E, rb, b_g = card.num_experts, s.router_saved_bytes, s.saved_gemm_bytes
    # busiest rank's (token, expert) pairs: each GPU of the EP group receives k x its routed tokens on
    # average (uniform routing); ETP all-gathers them over the etp ranks; x moe_load. What is saved for the
    # backward is sized by the buffers that hold it (a static budget or paged stash: s.buffer_load)
    kept = pairs * s.buffer_load / s.moe_load
    act_saved, down_saved = _mlp_saved(card, s, kept, card.expert_ffn / s.etp)
    # TE's GroupedLinear: one GEMM per local expert from a C++ loop; TorchTitan: one torch._grouped_mm; the
    # fused grouped MLP (TE op fuser + CuTe DSL): one persistent kernel per GEMM over every expert, the
    # activation x routing probability and the FC2 input's quantisation in FC1's epilogue
    titan = s.framework == "torchtitan"
    one_kernel = titan or s.fused_mlp
    loops = 0 if one_kernel else E_local
    act_b, act_k = _act_bytes_kernels(card, s, pairs * ffn_l)
    if s.fused_mlp:  # the epilogue writes the activated FC2 input: no separate pass over the FC1 output
        act_b, act_k = 0.0, 0
    ops = [_norm_op(card, s, "mlp_norm"),
           # router logits GEMM runs in bf16/fp32 in Megatron; its weight is tiny, dgrad and wgrad both run.
           # It keeps its input, the pre-MLP norm output (the same tensor feeds dispatch and shared experts)
           Op(name="router", kind=GEMM, m=tokens, n=E, k=H, dtype="bf16", host_ops=2,
              saved=(Saved("router_input", tokens * H * BF16),)),
           # softmax/sigmoid, top-k, score normalisation, aux loss, token counts per expert; keeps the
           # T x E logits and probabilities (fp32)
           _router_topk_op(s, tokens, E, rb),
           *_capacity_ops(s, tokens, E),
           *latent_down,
           _permute_op(s, tokens, pairs, W, E_local, Saved("routing_map", tokens * E * MASK)),
           Op(name="experts_up", kind=GEMM, m=m_e, n=up, k=W, groups=E_local, fused_groups=one_kernel, dtype=dt,
              host_ops=2, loop_launches=loops, segment=POST_SYNC, calls=(0.5, 0.5) if titan and card.gated else (),
              saved=(Saved("expert_fc1_input", kept * W * b_g),)),
           Op(name="experts_act", kind=MEMORY, bytes_f=act_b, kernels=act_k, host_ops=act_k, segment=POST_SYNC,
              saved=(Saved("expert_probs", kept * FP32),) + act_saved),
           Op(name="experts_down", kind=GEMM, m=m_e, n=W, k=ffn_l, groups=E_local, fused_groups=one_kernel, dtype=dt,
              host_ops=2, loop_launches=loops, segment=POST_SYNC, saved=down_saved),
           *latent_up]
    if dt != "bf16" and card.moe_latent_size:  # the latent projections' inputs
        ops.append(_quant_op(s, "latent_quant", _cast_bytes(s, tokens * (H + card.moe_latent_size)), POST_SYNC))
    if dt != "bf16":  # fused: only the dispatched tokens (FC1's input) are cast by a kernel of their own
        cast_elems = pairs * W if s.fused_mlp else pairs * (W + ffn_l)
        ops.append(_quant_op(s, "experts_quant", _cast_bytes(s, cast_elems), POST_SYNC, 2 * loops))
    if s.paged_stash:
        # Megatron-Core paged stash (transformer/moe/paged_stash.py): a Triton kernel copies each saved expert
        # activation (the received tokens' rows) into the paged buffer in the forward and pops it back in the
        # backward: read + write of the experts' saved bytes at the actual load, one launch per tensor
        stashed = [x for op in ops if op.name in ("experts_up", "experts_act", "experts_down") for x in op.saved]
        stash_b = sum(x.bytes for x in stashed) * s.moe_load / s.buffer_load
        ops.append(Op(name="experts_stash", kind=MEMORY, bytes_f=2 * stash_b, kernels=len(stashed),
                      host_ops=len(stashed), segment=POST_SYNC))
    if card.num_shared_experts:
        # fc1 input is the router input tensor (bf16: no extra copy; fp8: TE keeps an FP8 cast)
        fp8_in = (Saved("fc1_input_fp8", tokens * H * b_g),) if b_g != BF16 else ()
        ops += mlp_ops(card, s, card.shared_ffn, s.T, prefix="shared", segment=POST_SYNC, saved_input=fp8_in)
    ops.append(Op(name="mlp_residual", kind=MEMORY, bytes_f=BF16 * 3 * tokens * H, host_ops=1, segment=POST_SYNC,
                  saved=_dropout_mask(s, H)))
    return ops


def _latent_ops(card, s: Shapes, tokens: int) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """A latent MoE's projections (Megatron-Core MoELayer fc1_latent_proj before the dispatch, fc2_latent_proj after
    the combine: TELinear, replicated over TP, on the sequence-parallel shard), as (before, after); none without a
    latent size. The down projection's input is the router's (kept once in bf16; an FP8/FP4 copy of its own
    otherwise); the up projection keeps the combined latent tokens."""
    lat = card.moe_latent_size
    if not lat:
        return (), ()
    H, dt, b_g = card.hidden_size, s.dtype, s.saved_gemm_bytes
    saved = (Saved("latent_input_fp8", tokens * H * b_g),) if b_g != BF16 else ()
    down = Op(name="latent_down", kind=GEMM, m=tokens, n=lat, k=H, dtype=dt, host_ops=2, saved=saved)
    up = Op(name="latent_up", kind=GEMM, m=tokens, n=H, k=lat, dtype=dt, host_ops=2, segment=POST_SYNC,
            saved=(Saved("latent_output_input", tokens * lat * b_g),))
    return (down,), (up,)


def _permute_op(s: Shapes, tokens: int, pairs: float, H: int, local_experts: int, routing_map: Saved) -> Op:
    """The dispatcher's token copies around the exchange, after the sync, forward bytes (the backward mirrors
    them). The combine needs only the routing map (probs are applied in the expert activation, Megatron-Core
    weighted SwiGLU), so no k*T*H copy is saved on the way back.

    Every dispatcher permutes the tokens into expert order and back (read T + write k*T each way): Megatron-Core's
    all-to-all dispatcher before the exchange (``permute`` / ``unpermute``), DeepEP and HybridEP on the received
    tokens (``_DeepepManager``; HybridEP's ``dispatch_with_permute``, one kernel with the exchange only under
    ``moe_permute_fusion_into_hybridep``, which no priced recipe sets). The all-to-all dispatcher with more than
    one local expert also regroups the received rows by local expert after the dispatch and restores their
    order before the combine (``sort_chunks_by_idxs``; the drop-and-pad path transposes the capacity buffer
    instead): one more read + write of the k*T rows each way (``MoEAlltoAllTokenDispatcher``)."""
    copies = 2 * (tokens * H + pairs * H)  # permute + unpermute
    kernels = 6
    if s.framework == "megatron" and s.dispatcher == "alltoall" and local_experts > 1:
        copies += 2 * 2 * pairs * H  # sort_chunks_by_idxs after the dispatch, and its inverse before the combine
        kernels += 2
    return Op(name="permute", kind=MEMORY, bytes_f=BF16 * copies, kernels=kernels, host_ops=12, segment=POST_SYNC,
              saved=(routing_map,))


def _norm_op(card, s: Shapes, name: str, dropped_by: str = FULL) -> Op:
    # norm input, sequence-sharded under SP (K22 "LayerNorm: 2sbh" each); PyTorch's eager composite
    # RMSNorm also keeps its fp32 upcast and bf16 result
    elems = s.T_sp * card.hidden_size
    nb, nk = _norm_bytes_kernels(s, elems)
    saved = (Saved("input", elems * BF16, dropped_by),)
    if s.eager:
        saved += (Saved("fp32_upcast", elems * EAGER_RMSNORM_SAVED_EXTRA),)
    return Op(name=name, kind=MEMORY, bytes_f=nb, kernels=nk, host_ops=nk, saved=saved)


def dense_mlp_block_ops(card, s: Shapes) -> list[Op]:
    """Post-attention norm, dense MLP, second residual add."""
    H = card.hidden_size
    # fc1 GEMM input = norm output (K22 "2sbh", SP-sharded)
    fc1_in = (Saved("fc1_input", s.T_sp * H * s.saved_gemm_bytes),)
    return ([_norm_op(card, s, "mlp_norm")]
            + mlp_ops(card, s, card.ffn_hidden_size or 0, s.T, saved_input=fc1_in)
            + [Op(name="mlp_residual", kind=MEMORY, bytes_f=BF16 * 3 * s.T_sp * H, host_ops=1,
                  saved=_dropout_mask(s, H))])


SSD_KERNELS_F, SSD_KERNELS_B = 6, 12
"""Kernels of the fused split-conv1d-scan (mamba_ssm mamba_split_conv1d_scan_combined): forward conv1d, chunk
cumsum, chunk state, state passing, bmm chunk, chunk scan; backward those it recomputes (conv1d, cumsum, chunk
state, state passing) and the gradient kernels (chunk scan dstates / dz / dx / dC, state passing, chunk state dB,
bmm chunk, dA cumsum, conv1d)."""


def mamba_cp_groups(card, tp: int, cp: int) -> tuple[int, int]:
    """(B/C groups on a rank after the context-parallel all-to-all, their repeat count): Megatron-Core
    MambaContextParallel shards each TP rank's heads over cp; with fewer local groups than cp ranks each group's B
    and C are repeated so every rank holds its heads' group (groups_local_tpcp = 1, repeat = cp / groups)."""
    g = card.mamba_num_groups // tp
    return (1, cp // g) if g < cp else (g // cp, 1)


def mamba_cp_a2a_bytes(card, s: Shapes) -> tuple[float, float]:
    """Bytes per rank of a Mamba layer's context-parallel all-to-alls (MambaContextParallel ``pre_conv_ssm``: z, x,
    B, C (repeated), dt from sequence- to head-sharding before the conv and the scan; ``post_conv_ssm``: the scan's
    output back), forward; the backward sends the same back. (0, 0) without CP."""
    if s.cp == 1:
        return 0.0, 0.0
    tp, T = s.tp, s.T
    _, rep = mamba_cp_groups(card, tp, s.cp)
    d_in, bc = card.mamba_d_inner // tp, 2 * rep * card.mamba_num_groups // tp * card.mamba_state_dim
    return BF16 * T * (2 * d_in + bc + card.mamba_heads // tp), BF16 * T * d_in


def mamba_ops(card, s: Shapes) -> list[Op]:
    """A Mamba-2 layer (Megatron-Core MambaLayer / MambaMixer, training path ``use_mem_eff_path``): input norm (fused
    into in_proj), in_proj to z, x, B, C, dt, the layout transpose of that output, the fused split-conv1d-scan
    (SSD), the gated group RMSNorm over the scan's output, out_proj, residual add. TP splits heads and groups; with
    context parallelism (MambaContextParallel) the conv and the scan run over the whole sequence for heads /
    (tp x cp) between two all-to-alls (oracle.compute prices them)."""
    H, tp, cp, T, Tsp, dt, b_g = card.hidden_size, s.tp, s.cp, s.T, s.T_sp, s.dtype, s.saved_gemm_bytes
    in_w, d_in = card.mamba_in_proj_width // tp, card.mamba_d_inner // tp
    n_state, q, p = card.mamba_state_dim, card.mamba_chunk_size, card.mamba_head_dim
    heads = card.mamba_heads // tp // cp  # the heads this rank scans
    groups, _ = mamba_cp_groups(card, tp, cp)
    d_scan = heads * p  # d_inner of those heads
    conv = d_scan + 2 * groups * n_state  # x, B, C channels of the depthwise conv1d
    seq = s.seq_len  # every token of each sequence (the CP all-to-all gathers the sequence, shards the heads)
    tokens = s.mbs * seq  # tokens the scan sees (T x cp)
    chunks = s.mbs * -(-seq // q)
    states = chunks * heads * p * n_state  # inter-chunk states, one (P x N) per chunk and head
    # forward traffic per token (bf16): conv1d reads x B C and writes them convolved; the scan kernels read the
    # convolved x B C again (chunk state, chunk scan), z and dt, and write the gated output and the ungated
    # out_x. The chunk states: chunk_state writes them in fp32, state passing reads them and writes them in the
    # training state dtype (Megatron-Core mamba_training_ssm_states_dtype, default the params dtype: bf16),
    # chunk scan reads those (mamba_ssm ssd_combined _mamba_chunk_scan_combined_fwd)
    ssd_bytes = BF16 * tokens * (2 * conv + conv + d_scan + heads + 2 * d_scan) + (FP32 + FP32 + BF16 + BF16) * states
    ops = [_norm_op(card, s, "mamba_norm", KEPT),
           Op(name="in_proj", kind=GEMM, m=T, n=in_w, k=H, dtype=dt, host_ops=2,
              saved=(Saved("in_proj_input", Tsp * H * b_g),)),
           # rearrange(zxBCdt, "l b d -> b l d").contiguous(): a copy of the projection's output
           Op(name="mamba_transpose", kind=MEMORY, bytes_f=BF16 * 2 * T * in_w, host_ops=2)]
    if cp > 1:
        # around the all-to-alls (read + write each): the split projection packed per destination and unpacked
        # (all_to_all_sp2hp), concatenated, its load-balanced chunk order undone; the scan's output reordered and
        # packed back (MambaContextParallel pre_conv_ssm / post_conv_ssm)
        pre, post = mamba_cp_a2a_bytes(card, s)
        ops.append(Op(name="mamba_cp_copies", kind=MEMORY, bytes_f=2 * (3 * pre + 2 * post), kernels=16,
                      host_ops=24))
    ops += [
        # mamba_split_conv1d_scan_combined keeps its input zxBCdt and the scan's ungated output (out_x) and
        # recomputes the conv1d and the chunk states in backward (under CP: this rank's heads, whole sequence,
        # the same bytes)
        Op(name="mamba_ssd", kind=SSD, batch_heads=s.mbs * heads, s_q=seq, d_v=p, state=n_state,
           state_groups=s.mbs * groups, chunk=q, bytes_f=ssd_bytes, kernels=SSD_KERNELS_F, host_ops=8,
           saved=(Saved("zxbcdt", T * in_w * BF16), Saved("out_x", T * d_in * BF16))),
        # the output back to "l b d" (contiguous), then ExtendedRMSNorm over groups of d_inner / ngroups
        # (norm_before_gate=False: the scan already gated it with silu(z)); it keeps its input
        Op(name="mamba_out_norm", kind=MEMORY, bytes_f=BF16 * 4 * T * d_in, kernels=2, host_ops=4,
           saved=(Saved("norm_input", T * d_in * BF16),))]
    return ops + _mixer_out(card, s, "mamba", d_in)


def _mixer_out(card, s: Shapes, prefix: str, width: int) -> list[Op]:
    """A hybrid mixer layer's end: out_proj (row-parallel) from the rank's ``width`` channels, the FP8 / FP4 casts of
    the mixer's two GEMM inputs (in_proj's H, out_proj's width), the residual add."""
    H, T = card.hidden_size, s.T
    ops = [Op(name="out_proj", kind=GEMM, m=T, n=H, k=width, dtype=s.dtype, host_ops=2,
              saved=(Saved("out_proj_input", T * width * s.saved_gemm_bytes),))]
    if s.dtype != "bf16":
        ops.append(_quant_op(s, f"{prefix}_quant", _cast_bytes(s, T * H + T * width), PRE_SYNC))
    ops.append(Op(name=f"{prefix}_residual", kind=MEMORY, bytes_f=BF16 * 3 * s.T_sp * H, host_ops=1,
                  saved=_dropout_mask(s, H)))
    return ops


GDN_KERNELS_F, GDN_KERNELS_B = 6, 12
"""Kernels of flash-linear-attention's chunked gated delta rule: forward the gate's chunk cumsum, beta K K^T,
solve_tril, W/U, the state recurrence, the output; backward those it recomputes (W/U, the states) and the gradient
kernels (local dv, the reverse state recurrence dh / dv, dq dk dw dg, the WY backward, the cumsum's)."""


def gdn_cp_a2a_bytes(card, s: Shapes) -> tuple[float, float]:
    """Bytes per rank of a Gated DeltaNet layer's context-parallel all-to-alls (Megatron-Core GatedDeltaNet
    ``tensor_a2a_cp2hp`` of the whole in_proj output before the conv, ``tensor_a2a_hp2cp`` of the gated norm's
    output after it), forward; the backward sends the same back. (0, 0) without CP."""
    if s.cp == 1:
        return 0.0, 0.0
    return BF16 * s.T * card.gdn_in_proj_width / s.tp, BF16 * s.T * card.gdn_v_dim / s.tp


def gdn_ops(card, s: Shapes) -> list[Op]:
    """A Gated DeltaNet layer (Megatron-Core GatedDeltaNet as the self-attention of a TransformerLayer: Qwen3-Next's
    linear-attention layers): input norm (fused into in_proj), in_proj to q, k, v, the output gate z, beta and
    alpha, the depthwise causal conv1d with SiLU over q, k, v (flash-linear-attention causal_conv1d), the L2 norms
    of q and k and their repeat to the value heads, g and beta, the chunked gated delta rule, the output RMSNorm
    gated by silu(z) and its layout copy back, out_proj, residual add. TP splits the heads; with context
    parallelism the conv and the rule run over the whole sequence for heads / (tp x cp) between two all-to-alls
    (oracle.compute prices them)."""
    H, tp, cp, T, Tsp, dt, b_g = card.hidden_size, s.tp, s.cp, s.T, s.T_sp, s.dtype, s.saved_gemm_bytes
    in_w, qk, v = card.gdn_in_proj_width // tp, card.gdn_qk_dim // tp, card.gdn_v_dim // tp
    nv, dk, dv, c = card.gdn_num_value_heads // tp, card.gdn_key_head_dim, card.gdn_value_head_dim, GDN_CHUNK
    conv = 2 * qk + v
    rep = card.gdn_num_value_heads // card.gdn_num_key_heads  # q and k repeated to the value heads
    ops = [_norm_op(card, s, "gdn_norm", KEPT),
           Op(name="in_proj", kind=GEMM, m=T, n=in_w, k=H, dtype=dt, host_ops=2,
              saved=(Saved("in_proj_input", Tsp * H * b_g),))]
    if cp > 1:
        # the projection's heads permuted for one all-to-all (index_select), the result's chunk order undone, and
        # the norm output's way back (tensor_a2a_cp2hp / hp2cp), read + write each
        pre, post = gdn_cp_a2a_bytes(card, s)
        ops.append(Op(name="gdn_cp_copies", kind=MEMORY, bytes_f=2 * (2 * pre + 2 * post), kernels=8, host_ops=12))
    # from here on every tensor is per token of the rank's tokens (under CP: the whole sequence, heads / cp: the
    # same count of elements). causal_conv1d reads q, k, v (strided, in the projection's output) and writes them
    # convolved and activated, keeping its input; the prep copies q and k contiguous, L2-normalises them (keeping
    # the output), repeats them to the value heads, copies v and z contiguous; g = -exp(A) softplus(alpha + dt_bias)
    # in fp32 and sigmoid(beta) (one fused kernel)
    prep_bytes = BF16 * T * (2 * 2 * qk + 2 * 2 * qk + qk * 2 * (1 + rep) + 2 * v + 2 * v) + T * nv * (4 * BF16 + FP32)
    ops += [Op(name="gdn_conv", kind=MEMORY, bytes_f=BF16 * 2 * T * conv, kernels=1, host_ops=3,
               saved=(Saved("conv_input", T * conv * BF16),)),
            Op(name="gdn_prep", kind=MEMORY, bytes_f=prep_bytes, kernels=8 if rep > 1 else 6, host_ops=14,
               saved=(Saved("qk_l2norm_output", T * 2 * qk * BF16), Saved("alpha_beta", T * 2 * nv * BF16)))]
    heads = nv // cp
    seq = s.seq_len
    ops += [
        # ChunkGatedDeltaRuleFunction keeps q, k (repeated), v, g, beta and A (bf16, one C-wide row per token and
        # head) and recomputes W, U and the states in backward
        Op(name="gdn_rule", kind=GDN, batch_heads=s.mbs * heads, s_q=seq, d_qk=dk, d_v=dv, chunk=c,
           bytes_f=s.mbs * seq * heads * sum(k.bytes_per_token_head for k in gdn_kernels(dk, dv, c)),
           kernels=GDN_KERNELS_F, host_ops=10,
           saved=(Saved("qk_repeated", T * 2 * nv * dk * BF16), Saved("v", T * v * BF16),
                  Saved("g_beta", T * nv * (FP32 + BF16)), Saved("A", T * nv * c * BF16))),
        # the output norm (TENorm over one value head's width, keeping its input) times silu(z) in fp32 (one fused
        # kernel, keeping z and the normalised output), then "b s" back to "s b" (contiguous)
        Op(name="gdn_out_norm", kind=MEMORY, bytes_f=BF16 * 7 * T * v, kernels=3, host_ops=6,
           saved=(Saved("norm_input", T * v * BF16), Saved("gate_z", T * v * BF16),
                  Saved("normed", T * v * BF16)))]
    return ops + _mixer_out(card, s, "gdn", v)


def _as_layer_input(ops: list[Op]) -> list[Op]:
    """A block that is a whole layer of a hybrid model: its first op's input is the layer's input, what full
    recompute keeps as its checkpoint (KEPT)."""
    first = ops[0]
    saved = tuple(replace(t, dropped_by=KEPT) if i == 0 else t for i, t in enumerate(first.saved))
    return [replace(first, saved=saved)] + ops[1:]


def layer_ops(card, s: Shapes, kind: str, window: int | None = None) -> list[Op]:
    """Every op of one decoder layer (``kind``: oracle.model_card.LAYER_KINDS) for one micro-batch on one rank.

    Built once per (card, shapes, kind, window): the timing and the memory models both walk it."""
    try:
        return list(_layer_ops(card, s, kind, window))
    except TypeError:  # an unhashable card: build it uncached
        return _build_layer_ops(card, s, kind, window)


@lru_cache(maxsize=4096)
def _layer_ops(card, s: Shapes, kind: str, window: int | None) -> tuple[Op, ...]:
    return tuple(_build_layer_ops(card, s, kind, window))


def _build_layer_ops(card, s: Shapes, kind: str, window: int | None) -> list[Op]:
    if kind == "mamba":
        blocked = [(op, MAMBA) for op in mamba_ops(card, s)]
    elif kind == "gdn":  # a TransformerLayer whose self-attention is the Gated DeltaNet: the attention block
        blocked = [(op, ATTN) for op in gdn_ops(card, s)]
    elif kind in ("mlp", "moe_mlp"):  # a hybrid model's MLP-only or MoE-only layer
        blocked = []
    else:
        blocked = [(op, ATTN) for op in attention_ops(card, s, window)]
    if kind in MOE_KINDS:
        moe = moe_ops(card, s)
        blocked += [(op, ROUTER if op.name in ROUTER_OPS else EXPERTS)
                    for op in (_as_layer_input(moe) if kind == "moe_mlp" else moe)]
    elif kind in ("dense", "mlp"):
        mlp = dense_mlp_block_ops(card, s)
        blocked += [(op, MLP) for op in (_as_layer_input(mlp) if kind == "mlp" else mlp)]
    # each op tagged with its block and, a trainable GEMM, its weight-gradient traffic. The builders above make
    # fresh ops on every call (tests/oracle/test_dataclass_copy.py checks it), seen by nobody yet: tagged in place
    # through the slots (as replace_fast fills a copy) instead of copied
    for op, block in blocked:
        _SET_BLOCK(op, block)
        if _trains(op):
            _SET_WGRAD_C(op, s.wgrad_c_bytes)
    return [op for op, _ in blocked]


_SET_BLOCK = slot_setter(Op, "block")
_SET_WGRAD_C = slot_setter(Op, "wgrad_c_bytes")


def _trains(op: Op) -> bool:
    """A trainable GEMM: it has a weight gradient, whose traffic (``Op.wgrad_c_bytes``) the run's framework sets."""
    return op.kind == GEMM and op.has_wgrad


def _wgrad_traffic(s: Shapes, op: Op) -> dict[str, float]:
    """A trainable GEMM's weight-gradient traffic per element as the run's framework moves it (no change for
    other ops)."""
    return {"wgrad_c_bytes": s.wgrad_c_bytes} if _trains(op) else {}


def _with_wgrad_traffic(s: Shapes, ops: list[Op]) -> list[Op]:
    """Each trainable GEMM's weight-gradient traffic per element as the run's framework moves it."""
    return [replace_fast(op, **ch) if (ch := _wgrad_traffic(s, op)) else op for op in ops]


def embedding_ops(card, s: Shapes) -> list[Op]:
    """Embedding lookup (gather + write); backward scatter-adds into the fp32 gradient (~2x bytes)."""
    # vocab-parallel lookup keeps its int64 token ids; its output is layer 0's saved norm input
    return [Op(name="embedding", kind=MEMORY, bytes_f=BF16 * 2 * s.T_sp * card.hidden_size, host_ops=2,
               saved=(Saved("token_ids", s.T * INT64),))]


def output_ops(card, s: Shapes, vocab_local: int, loss_fusion: bool) -> list[Op]:
    """Final norm, logits GEMM (bf16, as Megatron keeps the output layer in high precision), cross-entropy."""
    T, H = s.T, card.hidden_size
    logits = T * vocab_local
    if s.framework == "torchtitan":
        # cross_entropy_loss(pred.float()) outside the compiled blocks: the fp32 log-probabilities are what
        # its backward keeps (the bf16 logits are not)
        ce, ce_kernels, kept = EAGER_LOSS_BYTES * logits, 4, Saved("log_probs_fp32", logits * FP32)
    else:
        ce = BF16 * logits * (2 if loss_fusion else 1) + (0 if loss_fusion else FP32 * 2 * logits)
        ce_kernels, kept = 2, Saved("logits", logits * BF16)
    # the logits GEMM keeps its bf16 input (the head runs outside the FP8 region) and its T x V/tp logits
    # (kept, bf16, by the cross entropy); the loss keeps a per-token fp32 loss (paper B.1)
    return _with_wgrad_traffic(s, [
        _norm_op(card, s, "final_norm"),
        Op(name="logits", kind=GEMM, m=T, n=vocab_local, k=H, dtype=s.output_dtype, host_ops=2,
           saved=(Saved("input", s.T_sp * H * BF16), kept)),
        Op(name="loss", kind=MEMORY, bytes_f=ce, kernels=ce_kernels, host_ops=2 * ce_kernels,
           saved=(Saved("per_token_loss", T * FP32),))])


def forward_flops(ops: list[Op]) -> float:
    """Forward FLOPs the ops execute (GEMMs + attention as run, causal)."""
    return sum(op.flops_f for op in ops)
