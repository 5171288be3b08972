"""Per-module memory of one GPU: parameters held and activations saved per micro-batch.

Each decoder layer, the embedding and the output head is a ``Block`` of ``Module``s. A module holds its
parameters and the tensors autograd keeps for its backward pass, as Megatron-Core with Transformer
Engine (TE) keeps them. The saved tensors are not listed here: they are the ``saved`` tensors of the
op graph's ops (``oracle.opgraph``, the one description of a layer that compute prices), grouped by the
module each op belongs to (``module_of``). Only the MTP module's own norms and projection, which have no
ops in the graph, list theirs here. Symbols (one micro-batch, one GPU):

    T   = mbs * seq_len / cp      tokens of the micro-batch on this context-parallel rank
    Ts  = T / tp with sequence parallelism (SP), else T   (norm / residual / GEMM-input regions)
    H hidden, a heads, g KV groups, d head dim, F FFN, F_e expert FFN, E experts, k top-k, V padded vocab
    B_g = the quantised copy TE keeps of a GEMM input under an FP8/FP4 recipe (1 B FP8, + scales), else 2;
          the MLP activation's input is 1 B with fp8_activations (Megatron activation_func_fp8_input_store)

Byte sizes: bf16 2, fp32 4, int64 8, dropout mask 1 (torch bool). Sources are cited per formula;
"K22" is Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Sec. 4.1: 34sbh + 5as^2b bytes per GPT layer, which this accounting reproduces
exactly under ``MemoryAssumptions(flash_attention=False, dropout=True)`` (tests/oracle/test_memory.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from oracle.config import RunConfig
from oracle.dataclass_copy import HashedOnce, replace_fast
from oracle.errors import InvalidConfigError
from oracle.model_card import LAYER_KINDS, MOE_KINDS, ModelCard
from oracle.opgraph import (ATTENTION, BF16, DEFAULT_RECOMPUTE_MODULES, FP32, GEMM, INT64, KEPT, MASK, RECOMPUTE_MODULES,
                            SELECTIVE, Op, Saved, Shapes, embedding_ops, kv_heads_per_rank, layer_ops, output_ops)

__all__ = ["BF16", "FP32", "INT64", "MASK", "MemoryAssumptions", "DEFAULT", "Tensor", "Module", "Block", "Blocks",
           "Shape", "shape_of", "blocks", "make_block", "module_of", "layer_activation_bytes",
           "attention_params_per_gpu", "mlp_params_per_gpu", "DEFAULT_SELECTIVE", "RecomputeRegion",
           "RECOMPUTE_REGIONS", "recompute_droppers", "replayed_ops", "op_sac_plan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAssumptions:
    """Modelling choices that are not training-config keys (defaults = Megatron-Core + TE today)."""

    flash_attention: bool = True
    """Fused attention keeps Q, K, V, the output and an fp32 logsumexp; False materialises the
    a x s x s softmax (K22's 2as^2b, plus 3as^2b with dropout)."""
    dropout: bool = False
    """Dropout after attention/MLP and on attention probabilities (modern LLM recipes use 0, and
    torch's dropout with p=0 keeps no mask)."""
    loss_fp32_scratch: bool = True
    """Unfused cross entropy keeps an fp32 softmax of T x V/tp (paper App. B.1), counted in other_bytes."""
    router_fp32: bool = True
    """Router logits and probabilities are kept in fp32 (Megatron moe_router_dtype=fp32)."""
    fsdp_prefetch_units: int = 2
    """FSDP: unsharded units (layers / embedding / head) alive at once: the current one + one prefetched."""
    fsdp_unsharded_grad: bool = True
    """FSDP: one unit's unsharded fp32 gradient exists before its reduce-scatter."""
    fp8_weight_cache: bool = True
    """precision=fp8 (nvfp4): TE caches each GEMM weight in FP8 (NVFP4) row- and column-wise (2 x 1 B,
    2 x 0.5625 B) across the micro-batches of a step (Megatron passes is_first_microbatch); not with FSDP."""
    deepep_nvl_tokens_per_peer: int = 2560
    """DeepEP NVLink buffer, in H-wide bf16 tokens per intra-node peer: 10 channels x 256 receive
    tokens (DeepEP's default dispatch Config(20 SMs, 6, 256, 6, 128), get_nvl_buffer_size_hint)."""
    deepep_rdma_tokens_per_node: int = 2560
    """DeepEP RDMA buffer when the EP group spans nodes: 10 channels x 128 tokens x 2 (send + receive)."""


DEFAULT = MemoryAssumptions()
DEFAULT_SELECTIVE = frozenset(DEFAULT_RECOMPUTE_MODULES)


Tensor = Saved
"""One saved tensor of one module (bytes per micro-batch): the op graph's ``Saved``, whose ``dropped_by``
says which recompute mode drops it ('selective': core attention; 'kept': the full-recompute checkpoint)."""


@dataclass(frozen=True, slots=True)
class Module:
    """One module: parameters on this GPU and the tensors it saves for backward."""

    name: str
    params: float
    tensors: tuple[Saved, ...] = ()
    recomputed_by: tuple[frozenset[str], ...] = ()
    """Per tensor: the recompute_modules values that drop it (``recompute_droppers``; empty: none)."""
    offloaded_by: tuple[frozenset[str], ...] = ()
    """Per tensor: the offload_modules values that move it to host memory (``OFFLOAD_OPS``; empty: none)."""
    expert: bool = False
    """Routed-expert weights (optimizer sharded over expert data parallel, edp)."""
    gemm: bool = False
    """Weights are TE GEMM weights (FP8 weight cache applies)."""


@dataclass(frozen=True, slots=True)
class Block:
    """A decoder layer, the embedding, the output head or an MTP module, with its sums."""

    name: str
    modules: tuple[Module, ...]
    params_dense: float
    params_expert: float
    gemm_params: float
    act_none: float
    """Saved bytes per micro-batch without recompute."""
    act_selective: float
    """Saved bytes with core attention recomputed (Megatron 'selective')."""
    checkpoint_bytes: float
    """Saved bytes under full recompute: the tensors tagged ``kept`` (the bf16 layer input only)."""
    drop_groups: tuple[tuple[frozenset[str], float], ...] = ()
    """Saved bytes per set of recompute_modules values that drop them (tensors dropped by none left out)."""
    act_op_sac: float = 0.0
    """Saved bytes under TorchTitan's op-level selective checkpointing (policy 'op_sac'): the checkpointed
    input plus the op outputs the policy saves (``op_sac_plan``)."""
    offload_groups: tuple[tuple[frozenset[str], frozenset[str], bool, float], ...] = ()
    """Saved bytes fine-grained activation offloading can move: (the offload_modules values that move them, the
    recompute_modules values that drop them, dropped by the default selective recompute, bytes)."""

    @property
    def params(self) -> float:
        return self.params_dense + self.params_expert

    def offloaded(self, policy: str, modules: frozenset[str], offload: frozenset[str]) -> float:
        """Saved bytes per micro-batch that ``offload`` (Megatron-Core offload_modules) moves to host memory under
        the recompute ``policy`` / ``modules`` (a tensor recompute drops is not saved, so not moved)."""
        if not offload or policy not in ("none", "selective"):
            return 0.0
        default = modules == DEFAULT_SELECTIVE
        return sum(nbytes for by, rec, core, nbytes in self.offload_groups if by & offload and not (
            policy == "selective" and ((rec & modules) or (default and core))))

    def act(self, policy: str, modules: frozenset[str] = DEFAULT_SELECTIVE) -> float:
        """Saved bytes per micro-batch under 'none', 'selective' (recomputing ``modules``), 'op_sac' or
        'checkpoint'."""
        if policy == "checkpoint":
            return self.checkpoint_bytes
        if policy == "op_sac":
            return self.act_op_sac
        if policy != "selective":
            return self.act_none
        if modules == DEFAULT_SELECTIVE:
            return self.act_selective
        return self.act_none - sum(b for by, b in self.drop_groups if by & modules)


def make_block(name: str, modules: tuple[Module, ...], op_sac_saved: float = 0.0) -> Block:
    """Sum a block's modules: parameters by kind, saved bytes per recompute mode (from the tensors' tags);
    ``op_sac_saved``: the op outputs op-level selective checkpointing saves besides the checkpoint."""
    none = sum(t.bytes for m in modules for t in m.tensors)
    core = sum(t.bytes for m in modules for t in m.tensors if t.dropped_by == SELECTIVE)
    groups: dict[frozenset[str], float] = {}
    offload: dict[tuple[frozenset[str], frozenset[str], bool], float] = {}
    for m in modules:
        for t, by in zip(m.tensors, m.recomputed_by):
            if by:
                groups[by] = groups.get(by, 0.0) + t.bytes
        for t, by, off in zip(m.tensors, m.recomputed_by or (frozenset(),) * len(m.tensors), m.offloaded_by):
            if off:
                key = (off, by, t.dropped_by == SELECTIVE)
                offload[key] = offload.get(key, 0.0) + t.bytes
    return Block(name, modules,
                 params_dense=sum(m.params for m in modules if not m.expert),
                 params_expert=sum(m.params for m in modules if m.expert),
                 gemm_params=sum(m.params for m in modules if m.gemm),
                 act_none=none, act_selective=none - core,
                 checkpoint_bytes=(ckpt := sum(t.bytes for m in modules for t in m.tensors if t.dropped_by == KEPT)),
                 drop_groups=tuple(groups.items()), act_op_sac=ckpt + op_sac_saved,
                 offload_groups=tuple((*k, v) for k, v in offload.items()))


@dataclass(frozen=True, slots=True)
class Shape(HashedOnce):
    """Everything besides the card that sizes a block (hashable: the block cache key)."""

    graph: Shapes
    """The op graph's per-rank shapes, with the saved-tensor assumptions below applied."""
    tokens: float
    """T = mbs * seq_len / cp."""
    seq_tokens: float
    """Ts = T / tp with SP, else T."""
    assumptions: MemoryAssumptions
    _hash: int = field(init=False, repr=False, compare=False)
    """The fields' hash, once (:class:`~oracle.dataclass_copy.HashedOnce`: a shape keys the block and sums caches)."""

    __hash__ = HashedOnce.__hash__
    __getstate__ = HashedOnce.__getstate__
    __setstate__ = HashedOnce.__setstate__


_LAST_SHAPE: tuple = (None, None, None)
"""(training, assumptions, Shape) of the latest shape_of call: a projection asks for the same shape several times."""


def shape_of(run: RunConfig, assumptions: MemoryAssumptions = DEFAULT) -> Shape:
    global _LAST_SHAPE
    t, a = run.training, assumptions
    last = _LAST_SHAPE
    if last[0] is t and last[1] is a:  # the same (immutable) objects: the same shape
        return last[2]
    tokens = t.mbs * t.seq_len / t.cp
    graph = Shapes.of(run, flash_attention=a.flash_attention, dropout=a.dropout,
                      router_saved_bytes=FP32 if a.router_fp32 else BF16)
    seq_tokens = tokens / t.tp if t.sp else tokens
    # one Shape per (graph, tokens, assumptions): graph and assumptions by identity (Shapes.of shares equal graphs;
    # the cached Shape holds both, so neither id can be reused while its entry lives)
    key = (id(graph), tokens, seq_tokens, id(a))
    shape = _SHAPE_OF.get(key)
    if shape is None:
        if len(_SHAPE_OF) > 4096:
            _SHAPE_OF.clear()
        shape = _SHAPE_OF[key] = Shape(graph=graph, tokens=tokens, seq_tokens=seq_tokens, assumptions=a)
    _LAST_SHAPE = (t, a, shape)
    return shape


_SHAPE_OF: dict[tuple, Shape] = {}


# ---------------------------------------------------------------------------------- parameters
def attention_params_per_gpu(card: ModelCard, tp: int) -> float:
    """Attention weights without the input norm: TP-split linears, replicated norms/row-parallel bias."""
    h = card.hidden_size
    if card.attention == "mla":
        # Megatron MLA: q/kv down-projections and latent norms are duplicated over TP
        # (TELinear parallel_mode='duplicated'); q_up/kv_up column- and out row-parallel.
        ql, kvl, rope = card.q_lora_rank, card.kv_lora_rank or 0, card.qk_rope_head_dim or 0
        rep = h * (kvl + rope) + card.norm_params(kvl)
        split = kvl * card.kv_width + card.attn_out_width * h
        if ql:
            rep += h * ql + card.norm_params(ql)
            split += ql * card.q_width
        else:
            split += h * card.q_width
        return rep + split / tp
    # the fused QKV weight split over TP; with fewer KV heads than ranks Megatron-Core splits it evenly too (the
    # ranks gather its output, oracle.opgraph.qkv_gather_bytes), no head replicated
    qkv_out = ((card.q_width + card.q_gate_width) / tp + 2 * kv_heads_per_rank(card, tp) * card.head_size
               if card.kv_heads >= tp else card.qkv_width / tp)
    p = h * qkv_out + card.attn_out_width / tp * h
    if card.linear_bias or card.qkv_bias:
        p += qkv_out
    if card.linear_bias:
        p += h  # row-parallel output bias is replicated
    if card.qk_layernorm:
        p += 2 * card.norm_params(card.head_size)
    if card.attention_sinks:
        p += card.num_attention_heads / tp
    return p


def mamba_params_per_gpu(card: ModelCard, tp: int) -> tuple[float, float]:
    """(GEMM weights, the rest) of a Mamba-2 mixer on one TP rank: in_proj (column-parallel) and out_proj
    (row-parallel); the conv1d, dt_bias, A_log, D and the gated norm split with the heads (MambaMixer marks them
    tensor_model_parallel); the input norm fused into in_proj is replicated."""
    rest = card.mamba_conv_dim * (card.mamba_conv_kernel + 1) + 3 * card.mamba_heads + card.mamba_d_inner
    return card.mamba_gemm_params() / tp, rest / tp + card.norm_params(card.hidden_size)


def gdn_params_per_gpu(card: ModelCard, tp: int) -> tuple[float, float]:
    """(GEMM weights, the rest) of a Gated DeltaNet mixer on one TP rank: in_proj (column-parallel) and out_proj
    (row-parallel); the conv1d, dt_bias and A_log split with the heads (GatedDeltaNet marks them
    tensor_model_parallel); the input norm fused into in_proj and the output norm (one value head wide) are
    replicated."""
    rest = (card.gdn_conv_dim * card.gdn_conv_kernel + 2 * card.gdn_num_value_heads) / tp
    return card.gdn_gemm_params() / tp, rest + card.norm_params(card.hidden_size) + card.norm_params(
        card.gdn_value_head_dim)


def mlp_params_per_gpu(card: ModelCard, ffn: float, tp: int, width: int | None = None) -> float:
    """One MLP / expert of intermediate size ``ffn`` on ``width`` (default hidden_size; a latent MoE's experts:
    expert_width) split over ``tp`` (fc1 column-, fc2 row-parallel)."""
    up = 2 if card.gated else 1
    w = width or card.hidden_size
    p = (up + 1) * w * ffn / tp
    if card.linear_bias:
        p += up * ffn / tp + w  # fc2 bias replicated
    return p


# ---------------------------------------------------------------------------------- modules
_MODULE_OF_OP = {"attn_norm": "input_norm", "attn_residual": "attention_residual", "mlp_norm": "pre_mlp_norm",
                 "mlp_residual": "mlp_residual", "router": "router", "router_topk": "router",
                 "router_capacity": "router", "permute": "token_dispatcher", "embedding": "embedding",
                 "final_norm": "final_norm", "logits": "output_layer", "loss": "loss", "mamba_norm": "mixer",
                 "in_proj": "mixer", "out_proj": "mixer", "mamba_residual": "mamba_residual",
                 "gdn_residual": "gdn_residual",
                 "latent_down": "latent_proj", "latent_up": "latent_proj", "latent_quant": "latent_proj"}
_MODULE_OF_PREFIX = {"mlp": "mlp", "experts": "experts", "shared": "shared_experts", "mamba": "mixer", "gdn": "mixer"}


def module_of(op_name: str) -> str:
    """The Megatron-Core module an op of the graph runs in (``mlp_*`` the dense MLP, ``experts_*`` the
    routed experts, ``shared_*`` the shared experts, a Mamba or Gated DeltaNet layer's ops its ``mixer`` (the input
    norm is fused into its in_proj); QKV / MLA projections, RoPE, core attention and the output projection are
    ``self_attention``)."""
    if op_name in _MODULE_OF_OP:
        return _MODULE_OF_OP[op_name]
    return _MODULE_OF_PREFIX.get(op_name.split("_")[0], "self_attention")


OFFLOAD_OPS: dict[str, frozenset[str]] = {
    "attn_norm": frozenset({"attn_norm"}), "qkv_linear": frozenset({"qkv", "q_down", "kv_down"}),
    "core_attn": frozenset({"attn_core"}), "attn_proj": frozenset({"attn_out"}), "mlp_norm": frozenset({"mlp_norm"}),
    "expert_fc1": frozenset({"experts_up"}), "moe_act": frozenset({"experts_act"}),
    "fused_group_mlp": frozenset({"experts_up", "experts_act", "experts_down"})}
"""Megatron-Core fine-grained activation offloading (TransformerConfig offload_modules): each value wraps a module's
forward in a saved-tensors hook that moves what it saves for backward to host memory (pipeline_parallel/
fine_grained_activation_offload.py): the ops of the op graph whose saved tensors that is."""
OFFLOAD_MIN_BYTES = 2 * 2**20
"""Smaller saved tensors stay on the GPU: Megatron-Core's min_offloaded_tensor_size (2^20 elements) at 2 bytes."""


def _offloaders(op: Op, tensor: Saved) -> frozenset[str]:
    if tensor.bytes < OFFLOAD_MIN_BYTES:
        return frozenset()
    return frozenset(k for k, names in OFFLOAD_OPS.items() if op.name in names)


def _with_saved(modules: Sequence[Module], ops: Sequence[Op], prefix: str = "") -> list[Module]:
    """``modules`` with the saved tensors of the ops that run in them, in op order, which recompute_modules values
    drop each and which offload_modules values move each to host memory."""
    saved: dict[str, list[Saved]] = {m.name: [] for m in modules}
    by: dict[str, list[frozenset[str]]] = {m.name: [] for m in modules}
    off: dict[str, list[frozenset[str]]] = {m.name: [] for m in modules}
    for op, droppers in zip(ops, recompute_droppers(ops)):
        saved[prefix + module_of(op.name)] += op.saved  # KeyError: an op whose module the block lacks
        by[prefix + module_of(op.name)] += droppers
        off[prefix + module_of(op.name)] += [_offloaders(op, x) for x in op.saved]
    return [replace_fast(m, tensors=tuple(saved[m.name]), recomputed_by=tuple(by[m.name]),
                         offloaded_by=tuple(off[m.name])) for m in modules]


# ---------------------------------------------------------------------------------- selective recompute
@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeRegion:
    """What one Megatron ``recompute_modules`` value checkpoints in a layer, on the op graph: the ops it
    replays in backward (their forward once) and the saved tensors that go. A checkpoint keeps its input
    and drops what the ops inside save; an output-discarding one (Megatron CheckpointWithoutOutput) also
    frees its output where the next op saved it."""

    when: str
    """The region exists in a layer whose graph has this op."""
    modules: frozenset[str] = frozenset()
    """Megatron modules (``module_of``) whose ops it replays and whose saved tensors it drops."""
    ops: frozenset[str] = frozenset()
    """Further ops, by name, it replays and drops the saved tensors of (finer than a module)."""
    keeps: frozenset[str] = frozenset()
    """``op.tensor``: tensors of those ops that are the checkpoint's input, kept."""
    discards: frozenset[str] = frozenset()
    """``op.tensor``: the discarded output as its consumer saved it, dropped too."""

    def replays(self, op: Op) -> bool:
        return op.name in self.ops or module_of(op.name) in self.modules

    def drops(self, op: Op, tensor: Saved) -> bool:
        key = f"{op.name}.{tensor.name}"
        return key in self.discards or (self.replays(op) and key not in self.keeps)


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


# Megatron-LM transformer_config.py recompute_modules: moe_act, layernorm, mla_up_proj discard outputs;
# core_attn, mlp, moe, shared_experts are normal checkpoints. Modelled: BF16 / TE's common case (with FP8,
# Megatron makes the consumer GEMMs save the bf16 input so the discarded output still frees it).
RECOMPUTE_REGIONS: dict[str, tuple[RecomputeRegion, ...]] = {
    # TransformerLayer._checkpointed_attention_forward: core attention keeps Q, K, V
    "core_attn": (RecomputeRegion(when="attn_core", ops=_f("attn_core"),
                                  keeps=_f("attn_core.q", "attn_core.k", "attn_core.v")),),
    # experts.py activation_checkpoint: the activation keeps its input (fc1 output, probs) and discards
    # its output, the fc2 input
    "moe_act": (RecomputeRegion(when="experts_act", ops=_f("experts_act"),
                                keeps=_f("experts_act.fc1_output", "experts_act.expert_probs"),
                                discards=_f("experts_down.act_output")),),
    # transformer_layer.py checkpoints a norm only where it is a module (TENorm): the MLA input norm and
    # the MoE pre-MLP norm; the TE spec fuses the GQA input norm and the dense pre-MLP norm into
    # linear_qkv / linear_fc1 (IdentityOp, skipped). Each discards its output, saved by the next GEMM
    "layernorm": (RecomputeRegion(when="kv_down", ops=_f("attn_norm"), keeps=_f("attn_norm.input"),
                                  discards=_f("q_down.qkv_input", "q_proj.qkv_input")),
                  RecomputeRegion(when="router", ops=_f("mlp_norm"), keeps=_f("mlp_norm.input"),
                                  discards=_f("router.router_input", "shared_up.fc1_input_fp8"))),
    # multi_latent_attention.py qkv_up_checkpoint: q/kv up-projections (with their fused latent norms,
    # TELayerNormColumnParallelLinear) and RoPE keep the latents, discard Q, K, V after core attention
    "mla_up_proj": (RecomputeRegion(when="kv_up", ops=_f("q_up", "q_proj", "kv_up", "qk_norm", "rope"),
                                    keeps=_f("q_up.q_latent", "kv_up.kv_latent", "q_proj.qkv_input"),
                                    discards=_f("attn_core.q", "attn_core.k", "attn_core.v")),),
    # transformer_layer.py recompute_mlp (dense MLP only): checkpoints self.mlp on the residual, its
    # norm fused into linear_fc1 (TE spec)
    "mlp": (RecomputeRegion(when="mlp_up", modules=_f("mlp"), ops=_f("mlp_norm"), keeps=_f("mlp_norm.input")),),
    # moe_layer.py moe_layer_recompute: router, dispatch, experts, combine, shared experts on the
    # pre-MLP norm output
    "moe": (RecomputeRegion(when="router", modules=_f("router", "token_dispatcher", "experts", "shared_experts",
                                                      "latent_proj"),
                            keeps=_f("router.router_input")),),
    # shared_experts.py: checkpoints the shared experts' forward on the norm output (the router's input)
    "shared_experts": (RecomputeRegion(when="shared_up", modules=_f("shared_experts")),),
}
assert tuple(RECOMPUTE_REGIONS) == RECOMPUTE_MODULES  # one list of names: oracle.opgraph


def _regions(ops: Sequence[Op]) -> list[tuple[str, RecomputeRegion]]:
    names = {op.name for op in ops}
    return [(name, r) for name, regions in RECOMPUTE_REGIONS.items() for r in regions if r.when in names]


def recompute_droppers(ops: Sequence[Op]) -> list[tuple[frozenset[str], ...]]:
    """Per op, per saved tensor: the recompute_modules values that drop it (a union: Megatron frees a
    tensor if any checkpoint around or after it discards it). They read only the ops' and tensors' names,
    so a graph of other sizes shares them (cached on the names)."""
    names = tuple((op.name, tuple(t.name for t in op.saved)) for op in ops)
    hit = _DROPPERS.get(names)
    if hit is None:
        regions = _regions(ops)
        hit = tuple(tuple(frozenset(n for n, r in regions if r.drops(op, t)) for t in op.saved) for op in ops)
        if len(_DROPPERS) > 4096:
            _DROPPERS.clear()
        _DROPPERS[names] = hit
    return list(hit)


_DROPPERS: dict[tuple, tuple[tuple[frozenset[str], ...], ...]] = {}


def replayed_ops(ops: Sequence[Op], modules: frozenset[str]) -> list[Op]:
    """The ops whose forward selective recompute of ``modules`` replays in backward, each once."""
    regions = [r for n, r in _regions(ops) if n in modules]
    return [op for op in ops if any(r.replays(op) for r in regions)]


def op_sac_plan(ops: Sequence[Op]) -> list[tuple[float, float]]:
    """Per op of one layer: (output bytes saved, share of its forward replayed) under TorchTitan's op-level
    selective activation checkpointing (torchtitan parallelize.py ``_get_custom_policy``): the outputs of
    attention (SDPA: output and logsumexp) and of every other matmul call (the 1st, 3rd, ... of the layer,
    counted per block) are saved; every other op (norms, RoPE, activations, casts, the remaining matmuls)
    is recomputed in backward from the checkpointed layer input. FP8 matmuls are counted as matmuls."""
    out, calls = [], 0
    for op in ops:
        if op.kind == GEMM:
            kept = 0.0
            for share in op.calls or (1.0,):
                calls += 1
                kept += share if calls % 2 == 1 else 0.0
            out.append((kept * op.groups * op.m * op.n * BF16, 1.0 - kept))
        elif op.kind == ATTENTION:
            rows = op.batch_heads * op.s_q
            out.append((rows * op.d_v * BF16 + rows * FP32, 0.0))
        else:
            out.append((0.0, 1.0))
    return out


def _layer(card: ModelCard, s: Shape, kind: str) -> Block:
    g = s.graph
    norm = card.norm_params(card.hidden_size)
    if kind in ("mamba", "gdn"):  # a hybrid model's Mamba-2 (MambaLayer) or Gated DeltaNet layer: norm + mixer + residual
        gemm, rest = (mamba_params_per_gpu if kind == "mamba" else gdn_params_per_gpu)(card, g.tp)
        mods = [Module("mixer", gemm, gemm=True), Module("mixer_state", rest), Module(f"{kind}_residual", 0.0)]
        ops = layer_ops(card, g, kind)
        return make_block(f"{kind}_layer", tuple(_with_saved(mods, ops)))
    mods = []
    if kind in ("dense", "moe", "attention"):
        mods += [Module("input_norm", norm), Module("self_attention", attention_params_per_gpu(card, g.tp), gemm=True),
                 Module("attention_residual", 0.0)]
    if kind != "attention":
        mods.append(Module("pre_mlp_norm", norm))
    if kind in MOE_KINDS:
        mods += [Module("router", card.router_params()), Module("token_dispatcher", 0.0),
                 Module("experts", card.num_experts / g.ep * mlp_params_per_gpu(card, card.expert_ffn, g.etp,
                                                                                 card.expert_width),
                        expert=True, gemm=True)]
        if card.moe_latent_size:  # fc1/fc2_latent_proj: replicated (TELinear parallel_mode duplicated)
            mods.append(Module("latent_proj", card.latent_proj_params(), gemm=True))
        if card.num_shared_experts:
            mods.append(Module("shared_experts", mlp_params_per_gpu(card, card.shared_ffn, g.tp), gemm=True))
    elif kind in ("dense", "mlp"):
        mods.append(Module("mlp", mlp_params_per_gpu(card, card.ffn_hidden_size or 0, g.tp), gemm=True))
    if kind != "attention":
        mods.append(Module("mlp_residual", 0.0))
    # saved tensors: the op graph's (the window changes attention FLOPs, not its saved tensors)
    ops = layer_ops(card, g, kind)
    sac = sum(b for b, _ in op_sac_plan(ops)) if g.framework == "torchtitan" else 0.0
    return make_block(f"{kind}_layer", tuple(_with_saved(mods, ops)), sac)


def _embedding(card: ModelCard, s: Shape) -> Block:
    pos = card.max_seq_len * card.hidden_size if card.position_embedding == "learned" else 0
    m = Module("embedding", card.padded_vocab(s.graph.tp) * card.hidden_size / s.graph.tp + pos)
    return make_block("embedding", tuple(_with_saved([m], embedding_ops(card, s.graph))))


def _head_modules(card: ModelCard, s: Shape, holds_weight: bool, prefix: str = "") -> list[Module]:
    tp = s.graph.tp
    h, v_r = card.hidden_size, card.padded_vocab(tp) / tp
    mods = [Module(f"{prefix}final_norm", card.norm_params(h)),
            Module(f"{prefix}output_layer", v_r * h if holds_weight else 0.0), Module(f"{prefix}loss", 0.0)]
    # loss_fusion changes the loss's bytes moved, not what it saves
    return _with_saved(mods, output_ops(card, s.graph, card.padded_vocab(tp) // tp, loss_fusion=True), prefix)


def _head(card: ModelCard, s: Shape, holds_weight: bool) -> Block:
    return make_block("output_head", tuple(_head_modules(card, s, holds_weight)))


def _scaled(mods: list[Module], n: int, weight_sets: int | None = None) -> tuple[Module, ...]:
    """``mods`` n times: their saved tensors x n, their parameters x ``weight_sets`` (default n; 1 where the n
    copies share one set of weights)."""
    w = n if weight_sets is None else weight_sets
    if n == 1 and w == 1:
        return tuple(mods)
    return tuple(replace_fast(m, params=m.params * w,
                              tensors=tuple(replace_fast(t, bytes=t.bytes * n) for t in m.tensors))
                 for m in mods)


def _mtp(card: ModelCard, s: Shape, kind: str) -> tuple[Block, Block]:
    """DeepSeek-V3 MTP modules (Megatron MultiTokenPredictionLayer) x card.mtp_layers, on the output
    stage: the recomputable part (norms, eh_proj, one layer) and its head (shares the output weight)."""
    h, Ts, n = card.hidden_size, s.seq_tokens, card.mtp_layers
    layer = _layer(card, s, kind)
    # the op graph has no ops for the MTP's norms and eh_proj (the projector prices an MTP module as one
    # layer + one head), so their saved tensors are listed here
    mods = [Module("mtp_embedding_lookup", 0.0, embedding_ops(card, s.graph)[0].saved),
            Module("mtp_norms", 2 * card.norm_params(h), (Saved("enorm_input", Ts * h * BF16),
                                                          Saved("hnorm_input", Ts * h * BF16))),
            Module("mtp_eh_proj", 2 * h * h / s.graph.tp, (Saved("input", Ts * 2 * h * BF16),), gemm=True)]
    mods += [replace_fast(m, name=f"mtp_layer.{m.name}") for m in layer.modules]
    # full recompute checkpoints the MTP layer's hidden-state input (Megatron MTP _checkpointed_forward):
    # the layer's 'kept' input norm tensor
    body = make_block(f"mtp x{n}", _scaled(mods, n, card.mtp_weight_sets))
    head = make_block(f"mtp_head x{n}", _scaled(_head_modules(card, s, holds_weight=False, prefix="mtp_"), n))
    return body, head


class Blocks:
    """The blocks of a model at one shape (cached per (card, shape)). Each part is built the first time it is
    read (a model without dense layers, tied embeddings or MTP modules never builds those parts): the same
    blocks, only those a projection reads."""

    __slots__ = ("_card", "_shape", "_parts")

    def __init__(self, card: ModelCard, s: Shape) -> None:
        self._card, self._shape = card, s
        self._parts: dict[str, Block | None] = {}

    def _part(self, name: str) -> Block | None:
        parts = self._parts
        if name in parts:
            return parts[name]
        card, s = self._card, self._shape
        if name in ("mtp", "mtp_head"):
            mtp = _mtp(card, s, "moe" if card.is_moe else "dense") if card.mtp_layers else (None, None)
            parts["mtp"], parts["mtp_head"] = mtp
        else:
            parts[name] = _BLOCK_PARTS[name](card, s)
        return parts[name]

    @property
    def dense(self) -> Block:
        return self._part("dense")  # type: ignore[return-value]

    @property
    def moe(self) -> Block | None:
        return self._part("moe")

    @property
    def embedding(self) -> Block:
        return self._part("embedding")  # type: ignore[return-value]

    @property
    def head(self) -> Block:
        """Final norm + output layer holding the output weight + loss."""
        return self._part("head")  # type: ignore[return-value]

    @property
    def head_no_weight(self) -> Block:
        """Same without the output weight (tied, on the embedding's own chunk)."""
        return self._part("head_no_weight")  # type: ignore[return-value]

    @property
    def mtp(self) -> Block | None:
        """MTP norms, projection and layer (recomputable)."""
        return self._part("mtp")

    @property
    def mtp_head(self) -> Block | None:
        """MTP final norms, logits and losses (kept, like the main head)."""
        return self._part("mtp_head")

    def layer(self, kind: str) -> Block:
        return self._part(kind)  # type: ignore[return-value]


def _edge_key(s: Shape) -> tuple:
    """What the embedding and output-head blocks read of a shape: their tensors' token counts, the vocabulary's
    tensor-parallel split and whose kernels save them (``embedding_ops``, ``output_ops``, ``_norm_op``: the layer
    sizes, experts, dtypes and dispatcher of the op graph do not enter them). Shapes that differ only elsewhere
    share the two blocks (tests/oracle/test_activations_opgraph.py builds them again for every shape of several
    spaces and compares)."""
    g = s.graph
    return g.T, g.T_sp, g.tp, g.framework, g.eager


_EDGE_BLOCKS: dict[tuple, Block] = {}


def _kept(cache: dict, key: Any, limit: int, build: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``build()`` where absent; the cache emptied first once it holds over ``limit``."""
    hit = cache.get(key)
    if hit is None:
        if len(cache) > limit:
            cache.clear()
        hit = cache[key] = build()
    return hit


def _edge_part(name: str, build: Callable[[ModelCard, Shape], Block]) -> Callable[[ModelCard, Shape], Block]:
    """``build`` cached on (card, :func:`_edge_key`): a search's new shapes mostly repeat their edges."""
    def part(card: ModelCard, s: Shape) -> Block:
        return _kept(_EDGE_BLOCKS, (name, card, *_edge_key(s)), 4096, lambda: build(card, s))
    return part


_BLOCK_PARTS = {
    "dense": lambda card, s: _layer(card, s, "dense"),
    "moe": lambda card, s: _layer(card, s, "moe") if card.is_moe else None,
    "mamba": lambda card, s: _layer(card, s, "mamba"),
    "gdn": lambda card, s: _layer(card, s, "gdn"),
    "attention": lambda card, s: _layer(card, s, "attention"),
    "mlp": lambda card, s: _layer(card, s, "mlp"),
    "moe_mlp": lambda card, s: _layer(card, s, "moe_mlp"),
    "embedding": _edge_part("embedding", _embedding),
    "head": _edge_part("head", lambda card, s: _head(card, s, True)),
    "head_no_weight": _edge_part("head_no_weight", lambda card, s: _head(card, s, False)),
}


COMPUTE_ONLY_SHAPE_FIELDS = frozenset({"dtype", "dispatcher", "router_fusion", "fused_mlp", "wgrad_c_bytes",
                                       "output_dtype", "attention_dtype"})
"""Shapes fields no block reads: they change what an op costs (its GEMM or attention precision, the bytes and
kernels of a cast, a permute, the router's top-k or the expert activation, the weight-gradient traffic), not the
tensors it saves nor the parameters it holds (each saved GEMM input is sized by ``saved_gemm_bytes``, which is
kept). Shapes that differ only in them share their blocks (tests/oracle/test_activations_opgraph.py builds the
blocks of each such shape again and compares)."""
_MEMORY_FIELDS: tuple[str, ...] = ()


def _memory_key(s: Shape) -> tuple:
    """What the blocks of ``s`` depend on: every field but :data:`COMPUTE_ONLY_SHAPE_FIELDS`."""
    global _MEMORY_FIELDS
    g = s.graph
    if not _MEMORY_FIELDS:
        from dataclasses import fields
        _MEMORY_FIELDS = tuple(f.name for f in fields(g) if f.init and f.name not in COMPUTE_ONLY_SHAPE_FIELDS)
    return (*[getattr(g, f) for f in _MEMORY_FIELDS], s.tokens, s.seq_tokens, s.assumptions)


_BY_MEMORY_KEY: dict[tuple, Blocks] = {}


@lru_cache(maxsize=2048)
def blocks(card: ModelCard, s: Shape) -> Blocks:
    """The blocks of ``card`` at ``s``: those of an earlier shape that differs from ``s`` only in fields no block
    reads (:data:`COMPUTE_ONLY_SHAPE_FIELDS`), else new ones."""
    return _kept(_BY_MEMORY_KEY, (card, _memory_key(s)), 2048, lambda: Blocks(card, s))


def clear_block_caches() -> None:
    """Forget every built block, the layers' and the embedding / head ones (tests that edit the op graph build them
    again)."""
    blocks.cache_clear()
    _BY_MEMORY_KEY.clear()
    _EDGE_BLOCKS.clear()


def layer_activation_bytes(run: RunConfig, kind: str, *, recompute: str | None = None,
                           assumptions: MemoryAssumptions = DEFAULT) -> float:
    """Saved bytes of one ``kind`` (oracle.model_card.LAYER_KINDS, one the model has) layer for one micro-batch on
    one GPU.

    ``recompute`` defaults to the run's; 'full' gives the checkpointed layer input only; 'selective'
    recomputes the run's recompute_modules (Megatron's default, core attention, when it has none).
    """
    if kind not in LAYER_KINDS:
        raise InvalidConfigError(f"kind={kind!r} must be one of {', '.join(LAYER_KINDS)}")
    if kind == "moe" and not run.model.is_moe:
        raise InvalidConfigError(f"kind='moe' but {run.model.name} is a dense model")
    if kind not in ("dense", "moe") and kind not in run.model.layer_kinds:
        raise InvalidConfigError(f"kind={kind!r}: {run.model.name} has no such layer (its kinds: "
                                 f"{', '.join(sorted(set(run.model.layer_kinds)))})")
    rc = recompute or run.training.recompute
    if rc not in ("none", "selective", "full"):
        raise InvalidConfigError(f"recompute={rc!r} must be none, selective or full")
    b = blocks(run.model, shape_of(run, assumptions)).layer(kind)
    if rc == "selective" and run.training.framework == "torchtitan":
        rc = "op_sac"
    return b.act("checkpoint" if rc == "full" else rc, run.training.recomputed_modules or DEFAULT_SELECTIVE)
