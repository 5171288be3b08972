"""The configuration model: training config, cluster, and the run they make with a model card.

Input files (YAML or JSON) have the sections ``model``, ``cluster`` and ``training``; see
``TrainingConfig`` for every training key and its default. ``RunConfig.load`` parses a file,
``RunConfig.from_dict`` a mapping; both reject unknown keys by name and run the legality checks
of :func:`oracle.legality.check`, raising one InvalidConfigError that lists every problem.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from oracle.cuda_graphs import CudaGraphImpl, CudaGraphScope
from oracle.dataclass_copy import replace_fast
from oracle.errors import InvalidConfigError, PrimusError
from oracle.hardware import (DEFAULT_MEMORY_MARGIN, HardwareProfile, bundled_hardware, load_hardware, profile_from_dict,
                             profile_to_dict)
from oracle.model_card import ModelCard, bundled_models, load_model
from oracle.opgraph import DEFAULT_RECOMPUTE_MODULES, AttentionBackend, OffloadModule, RecomputeModule
from oracle.pipeline.schedules import schedule_names
from oracle.schema import OneOf, from_dict, to_dict, unknown_key_problems
from oracle.yamlio import load_mapping

Schedule = Annotated[str, OneOf(lambda: ("auto", *schedule_names()))]
"""A registered pipeline schedule (oracle.pipeline.schedules) or 'auto'."""


_GEMM_DTYPES = {"fp8": "fp8", "nvfp4": "fp4"}
"""``TrainingConfig.gemm_dtype`` of each precision besides bf16."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """Everything about how the model is trained; defaults are those of the ``training`` section."""

    seq_len: int
    """Sequence length in tokens."""
    gbs: int
    """Global batch in sequences."""
    mbs: int = 1
    """Micro-batch in sequences."""
    tp: int = 1
    """Tensor parallel degree."""
    pp: int = 1
    """Pipeline parallel degree."""
    vpp: int = 1
    """Virtual pipeline chunks per rank (interleaved / V schedules)."""
    cp: int = 1
    """Context parallel degree."""
    cp_comm_type: Literal["p2p", "a2a", "all_gather"] = "p2p"
    """How the attention layers' context parallelism communicates (Megatron-Core ``cp_comm_type``, its
    TransformerConfig docstring): p2p (ring attention: K,V blocks passed round the ring, each step overlapped with
    the attention of the block in hand), a2a (DeepSpeed-Ulysses: all-to-alls scatter the heads over the CP ranks
    and gather the sequence before attention, and back after; not overlapped; the heads must split over the CP
    ranks) or all_gather (the full K,V all-gathered before attention, not overlapped; dK,dV reduce-scattered).
    Mamba and Gated DeltaNet layers use their own all-to-alls whatever it says."""
    ep: int = 1
    """Expert parallel degree."""
    etp: int = 1
    """Expert tensor parallel degree."""
    precision: Literal["bf16", "fp8", "nvfp4"] = "bf16"
    """GEMM precision of the decoder layers' linear layers (fp8 = FP8 GEMMs with BF16 weights and
    optimizer; nvfp4 = NVIDIA's NVFP4 recipe on Blackwell: block-scaled FP4 forward, dgrad and wgrad
    GEMMs with random-Hadamard-transformed wgrad inputs, BF16 master weights; attention core and the
    output layer stay BF16)."""
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "delayed"
    """How FP8 GEMM inputs are scaled (Megatron-Core ``--fp8-recipe``, default delayed): delayed (per-tensor
    scale from the amax history, cast in one pass), tensorwise (per-tensor current scaling: the producing
    kernel reduces the amax, the cast is one pass too), mxfp8 (MXFP8: an e8m0 scale per 32 values, the input quantised row-wise
    and column-wise, GEMMs on block-scaled tensor cores at ``efficiency.gemm_mxfp8``; Blackwell, CDNA4) or
    blockwise (1x128 / 128x128 blocks, DeepSeek-V3 style, quantised both ways, at the FP8 GEMM efficiency).
    Only with precision=fp8 (docs/kernel-model.md "FP8 recipes"). Under framework=torchtitan delayed and
    tensorwise both mean torchao's dynamic per-tensor float8 (its own casts), mxfp8 its MX converter."""
    fp8_activations: bool = False
    """The MLP activation's input (the FC1 output) is saved in FP8 (Megatron-Core
    ``activation_func_fp8_input_store``); the GEMM inputs TE saves are already the FP8 copies under an FP8 recipe
    (the paper's B_act = 1 on every tensor is this plus those)."""
    pp_schedule: Schedule = "auto"
    """Pipeline schedule; auto = 1f1b for vpp=1, interleaved for vpp>1."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation granularity."""
    recompute_num_layers: int | None = None
    """With full: decoder layers recomputed per pipeline stage (rank), spread evenly over its vpp
    chunks, the first layers of each chunk (Megatron 'block' method); None = all."""
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    """With selective: the modules recomputed in every layer (Megatron --recompute-modules): core_attn,
    moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts; None = Megatron's default (core_attn).
    What each drops and replays: docs/memory.md "recompute_modules"."""
    use_distributed_optimizer: bool = True
    """ZeRO-1: optimizer state sharded over data-parallel ranks."""
    fsdp: bool = False
    """ZeRO-3 / FSDP2 over the data-parallel group (parameters, grads and state sharded)."""
    grad_reduce_in_fp32: bool = False
    """Main-gradient buffer and its data-parallel reduction in fp32 (4 B) instead of bf16 (2 B).
    Megatron-LM forces true for bf16 training; the NeMo / Megatron-Bridge / Primus performance
    recipes reduce in bf16 (NeMo 1.x distributed fused Adam, Megatron-Bridge perf scripts)."""
    fp8_param_gather: bool = False
    """Megatron ``--fp8-param-gather``: FP8 GEMMs keep their weights as FP8 tensors (row- and column-wise
    data, 1 B each) instead of a BF16 copy plus an FP8 cache, and the distributed optimizer all-gathers
    FP8 (Megatron-Bridge's MXFP8 performance recipes turn it on). Needs precision fp8 and the
    distributed optimizer."""
    sequence_parallel: bool | Literal["auto"] = "auto"
    """Megatron sequence parallelism; auto = on when tp > 1."""
    moe_a2a_backend: Literal["alltoall", "deepep", "hybridep"] = "alltoall"
    """MoE token dispatcher: alltoall (Megatron-Core's all-to-all dispatcher over NCCL/RCCL: every top-k copy
    crosses the links), deepep (the flex dispatcher with DeepEP: one copy per destination node over RDMA, one
    per destination GPU over NVLink inside an 8-GPU node) or hybridep (the flex dispatcher with HybridEP: the
    same deduplication with the whole NVLink domain, e.g. an NVL72 rack, as the inner level; NVIDIA parts only:
    docs/comm.md "Flex dispatcher")."""
    moe_flex_dispatcher_num_sms: int | None = None
    """SMs the flex dispatcher's dispatch/combine kernels occupy while they run (Megatron-Core
    ``moe_flex_dispatcher_num_sms``, formerly ``moe_deepep_num_sms`` / ``moe_hybridep_num_sms``): what
    overlapped compute loses meanwhile. None = the backend's default, 20 (DeepEP's historical default per
    Megatron-Core's docstring; HybridEP's is taken as the same)."""
    moe_expert_rank_capacity_factor: float | None = None
    """HybridEP's static per-rank token budget (Megatron-Core ``moe_expert_rank_capacity_factor``): each
    expert-parallel rank receives at most this factor x its mean share of (token, expert) pairs, into
    buffers sized once, so the dispatcher reads no token counts on the host (no device-to-host sync: the
    MoE block can be captured in a CUDA graph). Pairs above the budget are dropped (none under balanced
    routing). Needs moe_a2a_backend=hybridep."""
    moe_paged_stash: bool = False
    """Routed-expert activations saved for backward go to a paged stash sized from the mean load
    (Megatron-Core ``moe_paged_stash``; needs moe_expert_rank_capacity_factor) instead of tensors sized by
    the static budget: memory x ``moe_paged_stash_buffer_factor`` of the balanced size."""
    moe_paged_stash_buffer_factor: float = 1.10
    """Size of the paged stash's device buffer over the balanced expert activations (Megatron-Core
    ``moe_paged_stash_buffer_size_factor_cuda``, default 1.10)."""
    moe_shared_expert_overlap: bool = False
    """The shared experts run on a side stream while the dispatch and combine all-to-alls are in flight
    (Megatron-Core ``moe_shared_expert_overlap``): their compute hides that much of the all-to-all."""
    delay_wgrad_compute: bool | None = None
    """The expert MLP's weight-gradient GEMMs are deferred (Megatron-Core ``delay_wgrad_compute``), so under
    ``moe_a2a_overlap`` the backward's all-to-all overlaps them too (without it only the dgrad covers it). None =
    with moe_a2a_overlap, as Megatron-Bridge's overlap setter turns both on (``delays_wgrad``)."""
    moe_router_fusion: bool = False
    """Router score function, top-k and aux-loss statistics in fused kernels (Megatron-Core
    ``moe_router_fusion``) instead of PyTorch's sequence of small ops."""
    fused_grouped_mlp: bool = False
    """The routed experts' MLP (FC1, activation x routing probability, quantise, FC2) as one fused grouped
    kernel over every local expert with device-side token counts (Transformer Engine's op fuser with the
    CuTe DSL grouped MLP: Megatron-Bridge ``cutedsl_fused_grouped_mlp`` / ``use_transformer_engine_op_fuser``).
    Removes the activation's and casts' HBM round trips and the per-expert launch loop. Transformer Engine fuses only a
    GLU expert MLP, on Blackwell (compute capability 10.x) and on MXFP8 or NVFP4 inputs (TE 2.20
    ``ops/fused/grouped_mlp.py``); elsewhere (a squared-ReLU expert MLP, which Megatron-Core also sends through the op
    fuser; BF16, per-tensor FP8 or Hopper) the op fuser runs the unfused GEMMs, activation and casts, priced as such,
    and only the device-side token counts (no host sync with a static HybridEP budget) carry over."""
    fp8_dot_product_attention: bool = False
    """The attention core (QK^T and PV) runs in FP8 (Transformer Engine FP8 fused attention, Megatron-Core
    ``fp8_dot_product_attention``): the tensor-core work at the FP8 rate; the softmax exponentials stay
    one per score, so the gain is capped by the part's special-function rate. Needs precision=fp8."""
    attention_backend: AttentionBackend = "auto"
    """Megatron-Core ``attention_backend`` (``--attention-backend``): auto, flash and fused run a tiled fused
    kernel (FlashAttention or cuDNN's fused attention: the attention tile model); unfused is Transformer Engine's
    UnfusedDotProductAttention, which materialises the score matrix: QK^T and PV as batched GEMMs over every
    (query, key) pair of the full square (the causal mask and a sliding window are applied after, not skipped),
    a softmax pass over the scores in HBM, and the bf16 probabilities kept for backward. local (Megatron-Core's
    own attention) needs ``--spec local``, layers without Transformer Engine, which this projection does not price."""
    fp8_output_proj: bool = False
    """The output layer's logits GEMM (LM head) runs in MXFP8 instead of BF16 (Megatron-Core
    ``fp8_output_proj``; only with fp8_recipe=mxfp8)."""
    first_last_layers_bf16: bool = False
    """Keep the first ``num_layers_at_start_in_bf16`` and last ``num_layers_at_end_in_bf16`` decoder layers'
    GEMMs in BF16 under an FP8/FP4 recipe (Megatron-Core ``first_last_layers_bf16``)."""
    num_layers_at_start_in_bf16: int = 1
    """Decoder layers at the start kept in BF16 with first_last_layers_bf16 (Megatron-Core default 1)."""
    num_layers_at_end_in_bf16: int = 1
    """Decoder layers at the end kept in BF16 with first_last_layers_bf16 (Megatron-Core default 1)."""
    gradient_accumulation_fusion: bool = True
    """Weight-gradient GEMMs accumulate into the main-gradient buffer in their epilogue (Megatron-Core
    ``gradient_accumulation_fusion``, TE ``fuse_wgrad_accumulation``); false = write a bf16 gradient, then
    an add kernel reads it and the buffer and writes the buffer."""
    cpu_offloading: bool = False
    """Offload the saved activations (and with ``cpu_offloading_weights`` the weights) of
    ``cpu_offloading_num_layers`` decoder layers per pipeline stage to host memory between forward and
    backward (Megatron-Core ``cpu_offloading``); the copies run over the host link beside compute."""
    cpu_offloading_num_layers: int = 0
    """Decoder layers per pipeline stage whose activations are offloaded (Megatron-Core
    ``cpu_offloading_num_layers``)."""
    cpu_offloading_weights: bool = False
    """Also offload those layers' weights (Megatron-Core ``cpu_offloading_weights``)."""
    offload_modules: tuple[OffloadModule, ...] | None = None
    """Fine-grained activation offloading (Megatron-Core ``fine_grained_activation_offloading`` with
    ``offload_modules``): in every decoder layer, what these modules save for backward (tensors of 2^20 elements or
    more) goes to host memory after their forward and comes back before their backward, over the host link beside
    compute: attn_norm, qkv_linear, core_attn, attn_proj (needs core_attn), mlp_norm, expert_fc1, moe_act,
    fused_group_mlp (oracle.activations.OFFLOAD_OPS). None or empty: off."""
    use_megatron_fsdp: bool = False
    """Megatron-FSDP (Megatron-Core ``use_megatron_fsdp`` with ``data_parallel_sharding_strategy=
    optim_grads_params``) as the ``fsdp`` implementation instead of PyTorch FSDP2: parameters, gradients and
    optimizer state sharded over the data-parallel group; needs fsdp=true."""
    fsdp_double_buffer: bool = False
    """Megatron-FSDP gathers each unit into one of two persistent buffers (Megatron-Core ``fsdp_double_buffer``):
    two units' unsharded weights are resident at all times."""
    optimizer: Literal["adam", "muon"] = "adam"
    """The optimizer: adam (AdamW; fp32 master, m, v) or muon (Muon-type: momentum + Newton-Schulz
    orthogonalisation of each 2-D weight's update, a few GEMM iterations per matrix on the rank that owns
    it after gathering the matrix; fp32 master + momentum; 1-D parameters and embeddings use AdamW)."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations per Muon update (Jordan et al. 2024 / Moonlight: 5)."""
    mtp_num_layers: int | None = None
    """Multi-token-prediction modules trained (Megatron-Core ``mtp_num_layers``); None = the model card's
    ``mtp_layers``. 0 trains the card without its MTP modules."""
    mtp_use_repeated_layer: bool | None = None
    """One MTP module's weights run at every depth (Megatron-Core ``mtp_use_repeated_layer``); None = the model
    card's ``mtp_shared_weights``."""
    moe_sync_free: bool = False
    """MoE layers run without device-to-host synchronisation (Primus-Turbo's sync-free MoE, which
    needs DeepEP). Off, every MoE-layer forward waits for the host once (the dispatcher reads the
    per-expert token counts to size the all-to-all and the grouped GEMMs) and the GPU idles for the
    profile's ``efficiency.moe_sync_stall_s``. Memory is DeepEP's; worst-case receive buffers that a
    sync-free dispatch may size statically are not modelled."""
    moe_a2a_overlap: bool = False
    """Overlap the MoE dispatch/combine all-to-all of one micro-batch with the compute of another
    (Megatron-Core ``--overlap-moe-expert-parallel-comm`` with ``--delay-wgrad-compute``: the forward of
    one micro-batch and the backward of the previous run merged layer by layer, DeepSeek-V3's
    DualPipe-style overlap). Needs a MoE model with ep > 1, pp == 1 or the interleaved schedule, and no
    full recompute. Costs the SMs the communication kernels take while they run (docs/comm.md); the
    activations in flight stay the schedule's: the paired forward saves layer by layer what the paired
    backward frees."""
    cuda_graph_impl: CudaGraphImpl = "none"
    """CUDA graphs (Megatron-Core ``--cuda-graph-impl``): none, local (Megatron-Core's CudaGraphManager) or
    transformer_engine (TE make_graphed_callables). A captured region replays with one launch instead of
    the host issuing its ops one by one: what it saves is the host time of host-bound passes (oracle.cuda_graphs)."""
    cuda_graph_scope: tuple[CudaGraphScope, ...] = ()
    """What is captured (Megatron-Core ``--cuda-graph-scope``): attn, mlp, moe_router, moe_preprocess, moe, or
    full_iteration (local only); empty (or full) = the whole layer. A scope holding the MoE dispatch needs
    static shapes (moe_pad_expert_input_to_capacity) or sync-free MoE: a dropless dispatcher reads token
    counts on the host every forward."""
    tp_comm_overlap: bool | Literal["auto"] = "auto"
    """Overlap TP all-gather/reduce-scatter with the adjacent GEMMs (Transformer Engine userbuffers);
    auto = on whenever sequence parallelism is on (as NeMo / Megatron-Bridge perf recipes do)."""
    overlap_grad_reduce: bool = True
    """Overlap the data-parallel gradient reduction with backward."""
    overlap_param_gather: bool = True
    """Overlap the distributed-optimizer / FSDP parameter all-gather with forward."""
    moe_imbalance: float = 1.0
    """Busiest-rank / mean expert load (paper Sec. 4.10); 1.0 = balanced."""
    moe_expert_capacity_factor: float | None = None
    """Token-drop MoE (Megatron ``--moe-expert-capacity-factor``): each expert takes at most this factor x
    its mean share of a micro-batch's (token, expert) pairs, the router drops the rest (Megatron-Core
    ``topk_softmax_with_capacity``). The busiest expert then works on min(moe_imbalance, factor) x the mean.
    None = dropless. Dropping changes what is trained: searches keep it at the baseline's value unless a
    space lists it."""
    moe_pad_expert_input_to_capacity: bool = False
    """Megatron ``--moe-pad-expert-input-to-capacity``: every expert's input padded to its capacity, so each
    expert GEMM and the all-to-all carry factor x the mean whatever the routing (static shapes: the
    all-to-all dispatcher sizes its splits without a device-to-host sync). Needs the capacity factor."""
    loss_fusion: bool = True
    """Fused cross-entropy (no fp32 logits scratch)."""
    decoder_first_pipeline_num_layers: int | None = None
    """Decoder layers on the first pipeline rank, split evenly over its vpp chunks (Megatron
    --decoder-first-pipeline-num-layers); the other ranks share the rest evenly. None = even split.
    How every layout key is resolved: :mod:`oracle.pipeline_layout`."""
    decoder_last_pipeline_num_layers: int | None = None
    """Decoder layers on the last pipeline rank (Megatron --decoder-last-pipeline-num-layers)."""
    pipeline_model_parallel_layout: str | None = None
    """Megatron's explicit layout string, one ``|``-separated entry per virtual stage in forward order
    (stage = chunk*pp + rank): E embedding, t decoder layer, m MTP module, L output layer and loss,
    ``X*n`` / ``(...)*n`` repeat, e.g. ``Et*3|(tt|)*29,m|L`` (Megatron --pipeline-model-parallel-layout).
    Excludes the four other layout keys."""
    account_for_embedding_in_pipeline_split: bool = False
    """The embedding counts as one decoder layer in the split: pp*vpp must divide num_layers+1 (+1
    more with the loss) and the first virtual stage holds one layer fewer (Megatron flag of that name)."""
    account_for_loss_in_pipeline_split: bool = False
    """The output layer and loss count as one decoder layer: the last virtual stage holds one fewer."""
    framework: Literal["megatron", "torchtitan"] = "megatron"
    """The training stack whose kernels the op graph prices (docs/kernel-model.md "Frameworks").
    megatron: Megatron-Core with Transformer Engine (fused norms, RoPE, SwiGLU, casts and cross entropy;
    per-expert grouped GEMMs on 4 streams). torchtitan: PyTorch-native modules (composite RMSNorm,
    complex-number RoPE, separate SiLU and multiply, GQA heads repeated before SDPA, cross entropy on
    fp32 logits, one grouped-mm kernel for the experts), FSDP2, op-level selective checkpointing; a
    torchtitan ``training`` section that leaves them unstated gets TorchTitan's defaults (FRAMEWORK_DEFAULTS)."""
    torch_compile: bool = False
    """TorchTitan's torch.compile of each transformer block: Inductor fuses the elementwise ops between
    the GEMMs and attention (norms, RoPE, SiLU x multiply, casts) as Transformer Engine does; the loss
    stays eager. Needs framework=torchtitan."""

    @property
    def op_level_sac(self) -> bool:
        """Selective recompute is TorchTitan's op-level selective activation checkpointing (the outputs
        of every other matmul and of attention are saved, everything else replayed), not Megatron's."""
        return self.recompute == "selective" and self.framework == "torchtitan"

    @property
    def fsdp_keeps_unsharded(self) -> bool:
        """FSDP keeps each stage's parameters unsharded from the first micro-batch's forward to the step, gathered once
        per step and reduce-scattered once: TorchTitan's default reshard policy under pipeline parallelism
        (``get_fsdp_reshard_after_forward_policy``: 'default' = not pp_enabled, "to avoid per-microbatch
        all-gathers"), with the unsharded gradients accumulated in the reduce dtype across the micro-batches."""
        return self.fsdp and self.framework == "torchtitan" and self.pp > 1

    @property
    def moe_load(self) -> float:
        """Busiest expert's (token, expert) pairs over the mean share: the imbalance when dropless, capped
        at the capacity factor when tokens drop, exactly the factor when padded to capacity."""
        cf = self.moe_expert_capacity_factor
        if cf is None:
            return self.moe_imbalance
        return cf if self.moe_pad_expert_input_to_capacity else min(self.moe_imbalance, cf)

    @property
    def delays_wgrad(self) -> bool:
        """Weight gradients deferred beside the backward's all-to-all (``delay_wgrad_compute``, None = with
        moe_a2a_overlap)."""
        return self.moe_a2a_overlap if self.delay_wgrad_compute is None else self.delay_wgrad_compute

    @property
    def moe_buffer_load(self) -> float:
        """What the routed experts' saved activations are sized for, over the balanced share: the paged stash's
        buffer factor, else HybridEP's static budget (the permuted tensors hold the budget's rows whatever the
        routing: Megatron-Core HybridEPDispatcher ``num_permuted_tokens``), else the load itself (moe_load)."""
        if self.moe_paged_stash:
            return self.moe_paged_stash_buffer_factor
        if self.moe_a2a_backend == "hybridep" and self.moe_expert_rank_capacity_factor is not None:
            return max(self.moe_expert_rank_capacity_factor, self.moe_load)
        return self.moe_load

    @property
    def moe_static_dispatch(self) -> bool:
        """HybridEP with a static per-rank budget and experts that read their token counts on the device (the
        fused grouped MLP): no host sync anywhere in the MoE block (Megatron-Core HybridEPDispatcher with
        ``num_permuted_tokens`` set; TEGroupedMLP's unfused path calls ``tokens_per_expert.tolist()``)."""
        return (self.moe_a2a_backend == "hybridep" and self.moe_expert_rank_capacity_factor is not None
                and self.fused_grouped_mlp)

    @property
    def moe_host_sync(self) -> bool:
        """Each MoE-layer forward waits once on the host for the per-expert token counts (Megatron-Core
        MoEAlltoAllTokenDispatcher, the flex dispatcher without a static budget, TEGroupedMLP's unfused
        split sizes): not with drop-and-pad (static splits), sync-free MoE, or a static HybridEP budget
        feeding the fused grouped MLP (``moe_static_dispatch``)."""
        return not (self.moe_sync_free or self.moe_pad_expert_input_to_capacity or self.moe_static_dispatch)

    @property
    def flex_sms(self) -> int:
        """SMs the flex dispatcher's kernels hold while they run (``moe_flex_dispatcher_num_sms`` or the
        backends' default 20)."""
        return self.moe_flex_dispatcher_num_sms if self.moe_flex_dispatcher_num_sms is not None else 20

    @property
    def sp(self) -> bool:
        """Sequence parallelism actually in effect."""
        return self.tp > 1 if self.sequence_parallel == "auto" else bool(self.sequence_parallel) and self.tp > 1

    @property
    def tp_overlap(self) -> bool:
        """TP communication overlap actually in effect."""
        return self.sp if self.tp_comm_overlap == "auto" else bool(self.tp_comm_overlap) and self.tp > 1

    @property
    def gemm_dtype(self) -> str:
        """Input precision of the decoder layers' linear GEMMs: bf16 | fp8 | fp4 (nvfp4)."""
        return _GEMM_DTYPES.get(self.precision, "bf16")

    @property
    def gemm_kernel(self) -> str:
        """The GEMM kernel class the decoder layers' linear GEMMs run: ``gemm_dtype``, with FP8 under the MXFP8
        recipe as 'mxfp8' (block-scaled tensor cores, their own achievable fraction)."""
        return "mxfp8" if self.precision == "fp8" and self.fp8_recipe == "mxfp8" else self.gemm_dtype

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """The Megatron modules selective recompute replays in every layer (empty without selective and
        under TorchTitan's op-level checkpointing, ``op_level_sac``)."""
        if self.recompute != "selective" or self.framework != "megatron":
            return frozenset()
        return frozenset(self.recompute_modules if self.recompute_modules is not None else DEFAULT_RECOMPUTE_MODULES)

    @property
    def schedule(self) -> str:
        """The concrete schedule ('auto' resolved)."""
        if self.pp_schedule != "auto":
            return self.pp_schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    def replace(self, **changes: Any) -> "TrainingConfig":
        return replace_fast(self, **changes)  # dataclasses.replace's object (no __post_init__ here), ~3x quicker


FRAMEWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    "megatron": {},
    # TorchTitan (torchtitan/config/job_config.py): data_parallel_shard_degree=-1 shards every remaining
    # GPU with FSDP2 (the optimizer state with it: no ZeRO-1 without it); mixed_precision_reduce=float32;
    # async TP is opt-in (enable_async_tensor_parallel, with compile); the loss is plain cross entropy
    "torchtitan": {"fsdp": True, "use_distributed_optimizer": False, "grad_reduce_in_fp32": True,
                   "tp_comm_overlap": False, "loss_fusion": False},
}
"""Training keys whose default depends on the framework: a ``training`` section that names the framework
and leaves one of these unstated gets the framework's value (RunConfig.from_dict)."""


def with_framework_defaults(training: Any) -> Any:
    """``training`` (a training-section mapping) with its framework's defaults for the keys it leaves out."""
    if not isinstance(training, dict) or not isinstance(training.get("framework"), str):
        return training
    return {**FRAMEWORK_DEFAULTS.get(training["framework"], {}), **training}


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A homogeneous cluster: one hardware profile and a GPU count."""

    hardware: HardwareProfile
    """The part and its network."""
    num_gpus: int
    """Total GPUs in the job."""
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    """Share of the allocatable HBM (capacity minus the runtime reserve) held back for allocator
    fragmentation and projection error: ``fits`` means peak <= (HBM - reserve) x (1 - margin).
    0.10 is the paper's pre-filter (App. C.3); AMD's projection CLI defaults to 0.05."""

    @property
    def num_nodes(self) -> float:
        return self.num_gpus / self.hardware.gpus_per_node

    @property
    def memory_cap_bytes(self) -> float:
        """The ``fits`` threshold per GPU (see ``memory_margin``)."""
        return self.hardware.memory_cap_bytes(self.memory_margin)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """A model, a cluster and a training config: the input of every projection."""

    model: ModelCard
    cluster: Cluster
    training: TrainingConfig
    model_ref: str = ""
    """How the model was named in the input (card name or path)."""
    hardware_ref: str = ""
    """How the hardware was named in the input."""
    recipe: tuple[Any, ...] = dataclasses.field(default=(), compare=False)
    """The input's ``recipe`` settings (oracle.recipe.RecipeEntry), each priced or ignored with why: what was
    read onto ``training`` (display only; ``to_dict`` writes the training it set)."""

    def __post_init__(self) -> None:
        # training.mtp_num_layers overrides the card's MTP modules (Megatron-Core --mtp-num-layers): the card
        # every projection reads is the one trained
        n = self.training.mtp_num_layers
        if n is not None and n >= 0 and n != self.model.mtp_layers:
            object.__setattr__(self, "model", self.model.replace(mtp_layers=n))
        shared = self.training.mtp_use_repeated_layer  # likewise the card's mtp_shared_weights
        if shared is not None and bool(shared) != self.model.mtp_shared_weights and self.model.mtp_layers:
            object.__setattr__(self, "model", self.model.replace(mtp_shared_weights=bool(shared)))

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Any, *, where: str = "config", check: bool = True) -> "RunConfig":
        if not isinstance(data, dict):
            raise InvalidConfigError(f"{where} must be a mapping with sections model, cluster, training; "
                                     f"got a {type(data).__name__}")
        problems = unknown_key_problems(data, ["model", "cluster", "training", "recipe"], where)
        for req in ("model", "cluster", "training"):
            if req not in data:
                problems.append(f"{where}: missing required section {req!r}")
        if problems:
            raise InvalidConfigError(problems)
        recipe: tuple[Any, ...] = ()
        card_fields: dict[str, Any] = {}
        if data.get("recipe") is not None:  # Megatron-Core / Megatron-Bridge names (oracle.recipe), under training
            from oracle.recipe import read_recipe
            rec = data["recipe"]
            if not isinstance(rec, (dict, str)):
                raise InvalidConfigError(f"{where}.recipe must be a mapping of Megatron setting -> value or a "
                                         f"'key=value;...' string, got {type(rec).__name__}")
            if not isinstance(data["training"], dict):
                raise InvalidConfigError(f"{where}.training must be a mapping, got {type(data['training']).__name__}")
            try:
                reading = read_recipe(rec)
            except InvalidConfigError as exc:
                raise InvalidConfigError([f"{where}.recipe: {p}" for p in exc.problems]) from None
            data = {**data, "training": {**reading.training, **data["training"]}}  # the training section wins
            recipe, card_fields = reading.entries, reading.model
        model_ref = data["model"]
        if not isinstance(model_ref, str):
            if isinstance(model_ref, dict):
                model = ModelCard.from_dict(model_ref, name=str(model_ref.get("name", "inline")))
                model_ref = model.name
            else:
                raise InvalidConfigError(f"{where}.model must be a card name or a path, got {model_ref!r}")
        else:
            model = None
        cl = data["cluster"]
        if not isinstance(cl, dict):
            raise InvalidConfigError(f"{where}.cluster must be a mapping with hardware and num_gpus "
                                     f"(or num_nodes), got {type(cl).__name__}: {cl!r}")
        problems += unknown_key_problems(cl, ["hardware", "num_gpus", "num_nodes", "memory_margin"], f"{where}.cluster")
        margin = cl.get("memory_margin", DEFAULT_MEMORY_MARGIN)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
            problems.append(f"{where}.cluster.memory_margin={margin!r} must be a number in [0, 1) "
                            f"(the share of allocatable HBM held back; default {DEFAULT_MEMORY_MARGIN})")
            margin = DEFAULT_MEMORY_MARGIN
        if "hardware" not in cl:
            problems.append(f"{where}.cluster: missing required key 'hardware'")
        if ("num_gpus" in cl) == ("num_nodes" in cl):
            problems.append(f"{where}.cluster: give exactly one of num_gpus or num_nodes")
        training = None
        try:
            training = from_dict(TrainingConfig, with_framework_defaults(data["training"]), f"{where}.training")
        except InvalidConfigError as exc:
            problems += exc.problems
        hw = None
        if "hardware" in cl:
            if isinstance(cl["hardware"], dict):  # an inline profile (what to_dict writes for a user profile)
                try:
                    hw = profile_from_dict(cl["hardware"], str(cl["hardware"].get("name", "inline")),
                                           where=f"{where}.cluster.hardware")
                except PrimusError as exc:
                    problems.append(str(exc))
            elif not isinstance(cl["hardware"], str):
                problems.append(f"{where}.cluster.hardware must be a profile name, a path or an inline profile, "
                                f"got {cl['hardware']!r}")
            else:
                try:
                    hw = load_hardware(cl["hardware"])
                except PrimusError as exc:
                    problems.append(str(exc))
        if model is None:
            try:
                model = load_model(model_ref)
            except PrimusError as exc:
                problems.append(str(exc))
        if model is not None and card_fields and any(getattr(model, k) != v for k, v in card_fields.items()):
            # the recipe's model overrides (oracle.recipe: e.g. vocab_size): an edited card, written inline by to_dict
            shown = ", ".join(f"{k}={v}" for k, v in card_fields.items())
            model = dataclasses.replace(model, **card_fields, name=f"{model.name} (recipe: {shown})")
            problems += [f"{where}.recipe: {p}" for p in model.problems()]
        num_gpus = None
        if hw is not None and ("num_gpus" in cl) != ("num_nodes" in cl):
            key = "num_gpus" if "num_gpus" in cl else "num_nodes"
            v = cl[key]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                problems.append(f"{where}.cluster.{key}={v!r} must be a positive integer")
            else:
                num_gpus = v if key == "num_gpus" else v * hw.gpus_per_node
        if problems:
            raise InvalidConfigError(problems)
        run = cls(model=model, cluster=Cluster(hardware=hw, num_gpus=num_gpus,  # type: ignore[arg-type]
                                               memory_margin=float(margin)),
                  training=training, model_ref=model_ref,  # type: ignore[arg-type]
                  hardware_ref=cl["hardware"] if isinstance(cl["hardware"], str) else hw.name,  # type: ignore[union-attr]
                  recipe=recipe)
        if check:
            run.check()
        return run

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None, *, check: bool = True) -> "RunConfig":
        data = load_mapping(path, "config file")
        data = apply_overrides(data, overrides or [])
        return cls.from_dict(data, where="config", check=check)

    def check(self) -> None:
        """Raise InvalidConfigError listing every legality problem (no-op when legal)."""
        from oracle.legality import check
        probs = check(self)
        if probs:
            raise InvalidConfigError(probs)

    # ------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, Any]:
        """Plain mapping that ``from_dict`` round-trips: a bundled card or profile by its name when this
        run holds exactly the bundled content, any other (a file, an inline or an edited one) inline."""
        t = to_dict(self.training)
        hw = self.cluster.hardware
        hw_name = _bundled_name(self.hardware_ref, hw, bundled_hardware, load_hardware)
        cluster: dict[str, Any] = {"hardware": hw_name or profile_to_dict(hw), "num_gpus": self.cluster.num_gpus}
        if self.cluster.memory_margin != DEFAULT_MEMORY_MARGIN:
            cluster["memory_margin"] = self.cluster.memory_margin
        model = _bundled_name(self.model_ref, self.model, bundled_models, load_model) or self.model.to_dict()
        return {"model": model, "cluster": cluster, "training": t}

    def key(self) -> str:
        """Stable short name of this configuration (for ledgers and trial names): a hash of the card's and
        the profile's content (not of the names they were loaded by), the cluster size and the training."""
        cluster: dict[str, Any] = {"hardware": hardware_digest(self.cluster.hardware),
                                   "num_gpus": self.cluster.num_gpus}
        if self.cluster.memory_margin != DEFAULT_MEMORY_MARGIN:
            cluster["memory_margin"] = self.cluster.memory_margin
        blob = json.dumps({"model": model_digest(self.model), "cluster": cluster,
                           "training": non_default_training(self.training)}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def with_training(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, training=self.training.replace(**changes))


_TRAINING_DEFAULTS = to_dict(TrainingConfig(seq_len=1, gbs=1))


def training_defaults() -> dict[str, Any]:
    """Every training key's default, as ``to_dict`` writes it (seq_len and gbs, which have none, as 1)."""
    return dict(_TRAINING_DEFAULTS)


def non_default_training(training: TrainingConfig) -> dict[str, Any]:
    """The training keys that differ from their defaults (seq_len and gbs always): what names a configuration,
    so that a key added to TrainingConfig with a default leaves every existing configuration's key alone."""
    return {k: v for k, v in to_dict(training).items() if k in ("seq_len", "gbs") or v != _TRAINING_DEFAULTS[k]}


_DOC_ONLY_CARD_KEYS = frozenset({"name", "family", "sources", "notes", "published_params_billion",
                                 "published_active_params_billion"})
_DOC_ONLY_PROFILE_KEYS = frozenset({"name", "description", "sources", "efficiency_sources"})


def _digest(data: dict[str, Any], skip: frozenset[str]) -> str:
    blob = json.dumps({k: v for k, v in data.items() if k not in skip}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


_DIGESTS: dict[int, tuple[Any, str]] = {}
"""id(card or profile) -> (it, its digest): both are frozen, and a search asks for the same few objects'
digests once per candidate (holding the object keeps its id from being reused)."""


def _per_object(cache: dict, key: Any, obj: Any, compute: Any) -> Any:
    """``compute(obj)``, kept in ``cache`` under ``key`` (which holds ``id(obj)``) with the object itself, so
    a reused id of a collected object is never taken for it; the cache is emptied at 256 entries."""
    hit = cache.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    if len(cache) >= 256:
        cache.clear()
    value = compute(obj)
    cache[key] = (obj, value)
    return value


def _cached_digest(obj: Any, compute: Any) -> str:
    return _per_object(_DIGESTS, id(obj), obj, compute)


def model_digest(card: ModelCard) -> str:
    """Hash of everything in a card that a projection reads (names, citations and notes left out; a key added to
    cards since configuration keys were first recorded left out at its default, so every existing card keeps
    its digest and every recorded ledger its keys)."""
    def compute(c: ModelCard) -> str:
        data = {k: v for k, v in c.to_dict().items() if k not in _CARD_DEFAULTS_SINCE or v != _CARD_DEFAULTS_SINCE[k]}
        return _digest(data, _DOC_ONLY_CARD_KEYS)
    return _cached_digest(card, compute)


_CARD_DEFAULTS_SINCE = {f.name: f.default for f in dataclasses.fields(ModelCard)
                        if f.name in ("hybrid_pattern", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim",
                                      "mamba_num_groups", "mamba_conv_kernel", "mamba_chunk_size",
                                      "moe_latent_size", "mtp_shared_weights", "attention_output_gate", "hybrid_pairs",
                                      "gdn_num_key_heads", "gdn_num_value_heads", "gdn_key_head_dim",
                                      "gdn_value_head_dim", "gdn_conv_kernel")}
"""Card keys added after configuration keys were first recorded (the hybrid Mamba keys and the latent MoE width,
2026-12-04; gated attention and the Gated DeltaNet keys, 2026-12-05), with their defaults."""


def hardware_digest(hw: HardwareProfile) -> str:
    """Hash of everything in a profile that a projection reads (human units, 12 significant digits)."""
    def compute(h: HardwareProfile) -> str:
        data = profile_to_dict(h)
        data["efficiency"] = {k: v["value"] for k, v in data["efficiency"].items()}  # values, not citations
        return _digest(data, _DOC_ONLY_PROFILE_KEYS)
    return _cached_digest(hw, compute)


_BUNDLED_NAMES: dict[tuple[Any, str, int], tuple[Any, str | None]] = {}
"""(registry, reference, id(component)) -> (the component, the bundled name that identifies it or None):
every projection's config view asks this of the same few cards and profiles (four file-system stats a call)."""


def _bundled_name(ref: str, held: Any, names: Any, load: Any) -> str | None:
    """The bundled name that alone identifies ``held`` (referenced as ``ref``), or None (write it inline)."""
    def compute(h: Any) -> str | None:
        name = ref if ref in names() else h.name
        return name if _is_bundled(name, h, names, load) else None
    return _per_object(_BUNDLED_NAMES, (names, ref, id(held)), held, compute)


def _is_bundled(name: str, held: Any, names: Any, load: Any) -> bool:
    """``held`` is exactly the bundled component ``name`` (so the name alone identifies it)."""
    if name not in names():
        return False
    bundled = load(name)
    return bundled is held or bundled == held  # the registry's cached object, usually: no field-by-field compare


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (``--set training.tp=8``) to a config mapping."""
    out = copy.deepcopy(data)
    problems = []
    for ov in overrides:
        if "=" not in ov:
            problems.append(f"--set {ov!r}: expected KEY=VALUE such as training.tp=8")
            continue
        key, raw = ov.split("=", 1)
        parts = [p.strip() for p in key.strip().split(".")]
        if not any(parts):
            problems.append(f"--set {ov!r}: empty key")
            continue
        if not all(parts):  # 'training.' or 'training..tp': a part left out, not a section to replace
            problems.append(f"--set {ov!r}: the key {key.strip()!r} has an empty part; write SECTION.KEY=VALUE such "
                            f"as training.tp=8")
            continue
        if len(parts) == 1 and parts[0] not in ("model", "cluster", "training"):
            parts = ["training", parts[0]]  # bare keys are training keys
        node = out
        ok = True
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                problems.append(f"--set {ov!r}: {p!r} is not a section")
                ok = False
                break
            node = nxt
        if ok:
            if parts[-1] == "num_gpus":
                node.pop("num_nodes", None)
            elif parts[-1] == "num_nodes":
                node.pop("num_gpus", None)
            node[parts[-1]] = _parse_scalar(raw.strip())
    if problems:
        raise InvalidConfigError(problems)
    return out
