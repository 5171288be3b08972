"""Per-GPU memory projection (paper App. B.1, with Megatron-Core's accounting): weights, gradients,
optimizer state, saved activations x in-flight micro-batches, and transient buffers, per pipeline rank.

The per-module shapes live in :mod:`oracle.activations` (saved tensors: the op graph's,
:mod:`oracle.opgraph`); this module assigns them to pipeline ranks, applies the byte costs and
sharding, and the schedule's in-flight micro-batch count. The worst rank decides ``fits`` against
``Cluster.memory_cap_bytes`` (HBM - reserve, less ``cluster.memory_margin``). See docs/memory.md for
the derivations.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from oracle.activations import (BF16, DEFAULT, DEFAULT_SELECTIVE, FP32, Block, Blocks, MemoryAssumptions, Shape,
                                blocks, layer_activation_bytes, shape_of)
from oracle.config import RunConfig
from oracle.cuda_graphs import STATIC_BUFFERS_PER_REGION, full_iteration, layer_regions
from oracle.errors import InvalidConfigError
from oracle.layout import Layout, placement_key
from oracle.model_card import HYBRID_KINDS, LAYER_KINDS, MOE_KINDS
from oracle.optimizers import ADAM_STATE_BYTES, state_bytes_per_param
from oracle.pipeline.schedules import get_schedule
from oracle.results import MemoryBreakdown, MemoryNode, StageMemory

__all__ = ["project_memory", "module_tree", "layer_activation_bytes", "in_flight_microbatches", "rank_param_counts",
           "chunk_activation_shares", "offloaded_bytes_per_microbatch",
           "MemoryAssumptions", "DEFAULT", "BYTES_WEIGHT", "BYTES_GRAD", "BYTES_OPTIMIZER"]

# Megatron mixed precision (bf16 params, fp32 main grads, Adam): 18 B/param, or 6 + 12/d with the
# distributed optimizer over d data-parallel ranks (Megatron-Core docs, "Distributed Optimizer" table).
BYTES_WEIGHT = 2
"""bf16 weight; also with precision=fp8 (Megatron keeps bf16 weights, TE casts per GEMM)."""
BYTES_GRAD = 4
"""fp32 main-gradient buffer (training.grad_reduce_in_fp32; Megatron-LM's default for bf16)."""
BYTES_GRAD_BF16 = 2
"""bf16 gradient buffer (training.grad_reduce_in_fp32 = false, the performance recipes)."""
BYTES_OPTIMIZER = ADAM_STATE_BYTES
"""fp32 master weight + Adam m + v (oracle.optimizers; Muon keeps 8 B for its 2-D weights)."""


# ---------------------------------------------------------------------------------- schedules
def in_flight_microbatches(schedule: str, pp: int, vpp: int, m: int, rank: int) -> float:
    """Micro-batches whose activations are alive on ``rank`` at its peak, in units of the rank's
    full per-micro-batch activation (all its chunks), capped by the m micro-batches of a step: the
    registered schedule's own formula (``ScheduleSpec.in_flight``)."""
    return get_schedule(schedule).in_flight_microbatches(pp, vpp, m, rank)


def _embedding_in_flight(schedule: str, pp: int, vpp: int, m: int) -> float:
    """Micro-batches of the first virtual stage (embedding) alive on rank 0 at its peak."""
    return get_schedule(schedule).embedding_in_flight(pp, vpp, m)


# ---------------------------------------------------------------------------------- rank plans
@dataclass(frozen=True, slots=True)
class _Chunk:
    chunk: int
    virtual_stage: int
    has_embedding: bool
    has_output: bool
    layers: tuple[tuple[str, str, int], ...]
    """(kind, policy, count) with policy 'none' | 'selective' | 'op_sac' | 'checkpoint'."""
    mtp: int = 0
    """MTP modules hosted here (oracle.pipeline_layout: with the loss unless a layout string says)."""


_PLANS: dict[tuple, tuple[tuple[_Chunk, ...], ...]] = {}


def _plan_key(run: RunConfig) -> tuple:
    """What :func:`_plans` reads of ``run``: its placement, and whether selective recompute is TorchTitan's
    op-level SAC (it sets the layers' policy, and placement_key does not hold the framework)."""
    return placement_key(run), run.training.op_level_sac


def _plans(run: RunConfig) -> tuple[tuple[_Chunk, ...], ...]:
    """Per rank, per chunk: layer kinds and recompute policy (cached; no per-layer work on a hit)."""
    t = run.training
    key = _plan_key(run)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    lay, kinds = Layout(run), run.model.layer_kinds
    ranks = []
    for r, chunks in enumerate(lay.stage_layers):
        out = []
        for c, layers in enumerate(chunks):
            vs = lay.virtual_stage(r, c)
            ks = kinds[layers[0]:layers[-1] + 1] if layers else ()  # a chunk's layers are contiguous
            if t.recompute == "full":  # Megatron 'block': the first layers of each chunk (Layout rule)
                n_rc = lay.recomputed_layers(r, c)
                groups = (("checkpoint", ks[:n_rc]), ("none", ks[n_rc:]))
            else:  # TorchTitan's selective checkpointing is op-level ('op_sac'), Megatron's by module
                groups = (("op_sac" if t.op_level_sac else t.recompute, ks),)
            counts = tuple((k, pol, g.count(k)) for pol, g in groups for k in LAYER_KINDS if g.count(k))
            st = lay.stage(r, c)  # embedding / loss / MTP placement from the pipeline layout
            out.append(_Chunk(c, vs, st.embedding, st.loss, counts, st.mtp))
        ranks.append(tuple(out))
    if len(_PLANS) > 4096:
        _PLANS.clear()
    plan = _PLANS[key] = tuple(ranks)
    return plan


def _mtp_policy(run: RunConfig) -> str:
    t = run.training
    if t.recompute == "full":
        return "checkpoint" if t.recompute_num_layers is None else "none"
    return "none" if t.op_level_sac else t.recompute  # op-level checkpointing wraps the decoder blocks only


def _modules(run: RunConfig) -> frozenset[str]:
    """The recompute_modules of a 'selective' policy (Megatron's default when the run names none)."""
    return run.training.recomputed_modules or DEFAULT_SELECTIVE


def _offload(run: RunConfig) -> frozenset[str]:
    """The offload_modules of fine-grained activation offloading (empty: off)."""
    return frozenset(run.training.offload_modules or ())


def _head(b: Blocks, run: RunConfig, ch: _Chunk) -> Block:
    # tied: the embedding's own chunk reuses it; any other chunk (pp > 1) keeps a copy of the word
    # embeddings as its output weight (Megatron shared_embedding_or_output_weight on the last stage)
    return b.head_no_weight if run.model.tied_embeddings and ch.has_embedding else b.head


def _extra_embedding_params(b: Blocks, run: RunConfig, ch: _Chunk) -> float:
    """Weight copies an MTP stage holds besides its modules (Megatron mtp_process): the MTP embeds the
    shifted tokens (an embedding copy where the stage lacks the embedding) and projects to logits with
    the output weight (a copy where the stage lacks the output layer); tied embeddings share one copy."""
    if not ch.mtp:
        return 0.0
    emb = b.embedding.params_dense
    if run.model.tied_embeddings:
        return 0.0 if ch.has_embedding or ch.has_output else emb
    out_w = b.head.params_dense - b.head_no_weight.params_dense
    return (0.0 if ch.has_embedding else emb) + (0.0 if ch.has_output else out_w)


def rank_param_counts(run: RunConfig, rank: int) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters held by one GPU of pipeline rank ``rank``:
    TP/EP-sharded, before distributed-optimizer / FSDP sharding (the data-parallel sync sizes)."""
    if not 0 <= rank < run.training.pp:
        raise InvalidConfigError(f"rank={rank} must be in 0..pp-1 = 0..{run.training.pp - 1}")
    sums = _rank_sums(run, shape_of(run), DEFAULT)[rank]  # the memory projection's own sums (cached)
    return sums.p_dense, sums.p_exp


def chunk_activation_shares(run: RunConfig, assumptions: MemoryAssumptions = DEFAULT
                            ) -> tuple[tuple[float, ...], ...]:
    """``[rank][chunk]``: the chunk's share of its rank's saved activation per micro-batch (decoder
    layers and a standalone MTP stage; 1/vpp each when the rank holds none). The pipeline simulator
    weighs each chunk's in-flight micro-batches by it, so uneven chunks count at their size. Read from the
    per-rank sums, whose formula adds up each chunk's activation beside the rank's."""
    return tuple(rk.chunk_share for rk in _rank_sums(run, shape_of(run, assumptions), assumptions))


def _shares(acts: Sequence[float], vpp: int) -> tuple[float, ...]:
    """Each chunk's share of the rank's activation ``acts`` (1/vpp each when it is 0)."""
    total = sum(acts)
    return tuple(a / total for a in acts) if total > 0 else (1.0 / vpp,) * vpp


# ---------------------------------------------------------------------------------- projection
class _Rank(NamedTuple):
    """What the memory of one pipeline rank sums over its chunks and depends on only the run's placement, shape
    and policies (cached on them, see :func:`_rank_sums`), each summed in the rank's chunk order."""

    p_dense: float
    """Non-expert parameters (layers, embedding, output, MTP modules and their weight copies)."""
    p_exp: float
    """Routed-expert parameters."""
    gemm: float
    """The decoder layers' (and MTP modules') GEMM weights: the FP8/FP4 weight caches' size."""
    layer_act: float
    """Saved activations of one micro-batch of the rank's layers (and a standalone MTP stage; less CPU-offloaded
    layers), multiplied by the in-flight micro-batches."""
    largest_unit: float
    """Parameters of the largest unit FSDP gathers at once (layer, embedding, head, MTP module)."""
    remat: float
    """One layer's recomputed tensors re-materialised during its backward (0: nothing recomputed)."""
    graph_regions: int
    """CUDA-graph regions of the rank's layers (0 under a whole-iteration graph or none)."""
    emb_act: float
    """The embedding's saved activation (0 where the rank holds no embedding)."""
    head_act: float
    """The output layer's saved activation (0 where the rank holds no output layer)."""
    mtp_act: float
    """MTP modules with the loss: their saved activation, held like the loss's (0 elsewhere)."""
    opt_bytes: float
    """Optimizer-state bytes per parameter of the rank's shard (Muon's share of 2-D weights)."""
    has_emb: bool
    """The rank holds the embedding."""
    has_moe: bool
    """The rank holds MoE layers (it allocates the token-dispatch buffers)."""
    loss: tuple[tuple[float, bool], ...]
    """(bytes, present) of the unfused loss's fp32 softmax of each chunk with heads, in chunk order."""
    chunk_share: tuple[float, ...]
    """Each chunk's share of the rank's saved activation per micro-batch (:func:`chunk_activation_shares`)."""


N_NUMERIC = 11
"""The first fields of ``_Rank`` are its floats (what the batch stacks into arrays)."""


_RankSums = tuple[_Rank, ...]
"""One :class:`_Rank` per pipeline rank."""


class _BatchRow(NamedTuple):
    """Sums the batch path computed (:func:`_batch_terms`), kept as one row of its arrays until a projection reads
    them (:func:`_rank_sums` makes them a ``_RankSums`` then)."""

    nums: np.ndarray
    """(runs, ranks, ``N_NUMERIC``) of the runs of one placement and policies."""
    flags: tuple[tuple[bool, bool], ...]
    """Per rank (has_emb, has_moe)."""
    losses: tuple[tuple[np.ndarray, ...], ...]
    """Per rank the loss scratch bytes of each chunk with heads, arrays over the runs."""
    acts: tuple[np.ndarray, ...]
    """Per rank each chunk's saved activation per micro-batch, (runs, chunks)."""
    row: int


_SUMS: dict[tuple, "_RankSums | _BatchRow"] = {}
"""Per-rank sums by :func:`_sums_key`: the scalar path's, or a row of the batch path's arrays."""
_SUMS_MAX = 16384


def _sums_key(run: RunConfig, s: Shape) -> tuple:
    """Everything :func:`_rank_sums` reads of ``run`` and its shape: placement, shape, recompute policies, and the
    loss, offloading, CUDA-graph and optimizer settings (the shape is the key's second item)."""
    t = run.training
    return (_plan_key(run), s, _mtp_policy(run), _modules(run), t.loss_fusion, t.cpu_offloading,
            t.cpu_offloading_num_layers, _offload(run), layer_regions(t, "dense"), layer_regions(t, "moe"),
            full_iteration(t),
            t.optimizer, *((tuple(layer_regions(t, k) for k in HYBRID_KINDS),) if run.model.is_hybrid else ()))


def _rank_sums(run: RunConfig, s: Shape, assumptions: MemoryAssumptions) -> _RankSums:
    """The per-rank sums of ``run`` (cached on :func:`_sums_key`): :func:`_sums_formula` on one run's floats."""
    last = _LAST_SUMS
    if last[0] is run and last[1] is s:  # the same immutable objects (a projection asks three times)
        return last[2]
    hit = _keyed_sums(run, s, assumptions)
    _LAST_SUMS[:] = (run, s, hit)
    return hit


_LAST_SUMS: list = [None, None, None]
"""(run, shape, sums) of the latest :func:`_rank_sums`."""


def clear_caches() -> None:
    """Forget every placement plan and per-rank sum (tests: each path then computes its own)."""
    _PLANS.clear()
    _SUMS.clear()
    _LAST_SUMS[:] = (None, None, None)


def _keyed_sums(run: RunConfig, s: Shape, assumptions: MemoryAssumptions) -> _RankSums:
    key = _sums_key(run, s)
    hit = _SUMS.get(key)
    if type(hit) is tuple:
        return hit
    vpp = run.training.vpp
    if hit is not None:  # a row of the batch path's arrays: the same formula
        k = hit.row
        hit = tuple(_Rank(*row[:6], int(row[6]), *row[7:], *flag, tuple((float(x[k]), True) for x in loss),
                          _shares(acts[k].tolist(), vpp))
                    for row, flag, loss, acts in zip(hit.nums[k].tolist(), hit.flags, hit.losses, hit.acts))
    else:
        hit = tuple(_Rank(*nums, has_emb, has_moe, tuple((x, True) for x in loss), _shares(acts, vpp))
                    for nums, has_emb, has_moe, loss, acts in _sums_formula(
                        _Scalar, run, blocks(run.model, s), s.tokens, s.graph.tp, assumptions))
        if len(_SUMS) > _SUMS_MAX:
            _SUMS.clear()
    _SUMS[key] = hit
    return hit


def _sums_formula(xp, run: RunConfig, b, tokens, tp, assumptions: MemoryAssumptions) -> list:
    """Per rank of ``run``'s placement: (the ``N_NUMERIC`` sums of :class:`_Rank`, has_emb, has_moe, the loss
    scratch bytes per chunk with heads, each chunk's saved activation per micro-batch). ``b`` its blocks,
    ``tokens`` and ``tp`` its shape's tokens per micro-batch and tensor-parallel size: one run's (:class:`Blocks`,
    numbers; ``xp`` = ``_Scalar``) or, for runs of one placement and policies but of different shapes, arrays over
    the runs (:class:`_BlockColumns`; ``xp`` = numpy): the same operations in the same order, so the same bits.
    Of ``run`` it reads only what :func:`_sums_key` holds besides the shape (the batch groups runs on that)."""
    t, card = run.training, run.model
    mtp_pol, mods, offl = _mtp_policy(run), _modules(run), _offload(run)
    no_graphs = full_iteration(t)
    ranks = []
    for chunks in _plans(run):
        p_dense = p_exp = gemm = layer_act = emb_act = head_act = mtp_edge = 0.0
        remat = 0.0  # one layer's recomputed tensors re-materialised during its backward
        largest_unit = 0.0  # FSDP gathers one layer / embedding / head at a time
        graph_regions = 0  # CUDA-graph regions of the rank's layers (static input/output buffers each)
        has_moe = has_emb = False
        loss: list = []
        chunk_acts: list = []
        for ch in chunks:
            chunk_act = 0.0  # the chunk's own sum (its share of the rank's activation)
            for kind, pol, n in ch.layers:
                lb = b.layer(kind)
                has_moe |= kind in MOE_KINDS
                p_dense += n * lb.params_dense
                p_exp += n * lb.params_expert
                gemm += n * lb.gemm_params
                act = n * lb.act(pol, mods)
                if offl:  # fine-grained offloading: what the modules save waits in host memory, like a recompute's
                    off = lb.offloaded(pol, mods, offl)  # drop, and is back for the layer's backward
                    act = act - n * off
                    remat = xp.maximum(remat, off + (lb.act_none - lb.act(pol, mods) if pol != "none" else 0.0))
                layer_act += act
                chunk_act += act
                graph_regions += n * len(layer_regions(t, kind))
                largest_unit = xp.maximum(largest_unit, lb.params)
                if pol != "none":
                    remat = xp.maximum(remat, lb.act_none - lb.act(pol, mods))  # op_sac can save more than none
            if ch.has_embedding:
                e = b.embedding
                p_dense += e.params_dense
                emb_act, has_emb = e.act_none, True
                largest_unit = xp.maximum(largest_unit, e.params)
            if ch.has_output:
                hd = _head(b, run, ch)
                p_dense += hd.params_dense
                head_act = hd.act_none
                largest_unit = xp.maximum(largest_unit, hd.params)
            if ch.mtp and b.mtp is not None and b.mtp_head is not None:  # all MTP modules sit on one chunk
                extra = _extra_embedding_params(b, run, ch)
                p_dense += b.mtp.params_dense + b.mtp_head.params_dense + extra
                p_exp += b.mtp.params_expert
                gemm += b.mtp.gemm_params
                mtp_act = b.mtp.act(mtp_pol, mods) + b.mtp_head.act_none
                if ch.has_output:  # with the loss: its backward starts right after its forward
                    mtp_edge = mtp_act
                else:  # a stage of its own (layout string): held like a layer until the loss's gradient returns
                    layer_act += mtp_act
                    chunk_act += mtp_act
                has_moe |= card.is_moe
                largest_unit = xp.maximum(xp.maximum(largest_unit, b.mtp.params / card.mtp_weight_sets), extra)
                if mtp_pol != "none":
                    remat = xp.maximum(remat, (b.mtp.act_none - b.mtp.act(mtp_pol, mods)) / card.mtp_layers)
            heads = int(ch.has_output) + ch.mtp
            if heads and not t.loss_fusion and assumptions.loss_fp32_scratch:
                # unfused cross entropy: fp32 softmax T x V/tp (paper B.1), per head incl. MTP
                v_r = card.padded_vocab(tp) / tp
                loss.append(heads * tokens * v_r * FP32)
            chunk_acts.append(chunk_act)
        if t.cpu_offloading and t.cpu_offloading_num_layers:
            # the offloaded layers' saved activations live in host memory; one layer's worth stays as the
            # staging buffer its copy runs through (Megatron-Core's double-buffered offload handler)
            n_layers = sum(n for ch in chunks for _, _, n in ch.layers)
            per_layer = layer_act / n_layers if n_layers else 0.0
            layer_act -= max(0, min(t.cpu_offloading_num_layers, n_layers) - 1) * per_layer
        # Muon: the layers' GEMM weights (2-D) keep master + momentum, the rest AdamW's three fp32 values
        params = p_dense + p_exp
        opt_bytes = state_bytes_per_param(t.optimizer, xp.where(params != 0, xp.minimum(
            1.0, gemm / xp.where(params != 0, params, 1.0)), 0.0))
        ranks.append(((p_dense, p_exp, gemm, layer_act, largest_unit, remat, 0 if no_graphs else graph_regions,
                       emb_act, head_act, mtp_edge, opt_bytes), has_emb, has_moe, loss, chunk_acts))
    return ranks


class _BlockColumns:
    """The :class:`Blocks` interface :func:`_sums_formula` reads, over several shapes at once: each part's
    values as arrays over the shapes (``b.layer(kind).params_dense``, ``b.head.act_none``, ``act(policy,
    modules)``, ...), each built on first read."""

    __slots__ = ("_bs", "_parts")

    def __init__(self, bs: Sequence[Blocks]) -> None:
        self._bs, self._parts = bs, {}

    def _part(self, name: str) -> "_PartColumns | None":
        hit = self._parts.get(name)
        if hit is None and name not in self._parts:
            parts = [b._part(name) for b in self._bs]
            hit = self._parts[name] = None if parts[0] is None else _PartColumns(parts)
        return hit

    def layer(self, kind: str) -> "_PartColumns":
        return self._part(kind)  # type: ignore[return-value]

    embedding = property(lambda self: self._part("embedding"))
    head = property(lambda self: self._part("head"))
    head_no_weight = property(lambda self: self._part("head_no_weight"))
    mtp = property(lambda self: self._part("mtp"))
    mtp_head = property(lambda self: self._part("mtp_head"))


class _PartColumns:
    """One block part of several shapes: its fields as float64 arrays over the shapes."""

    def __init__(self, parts: Sequence[Block]) -> None:
        self._blocks = parts

    def __getattr__(self, field: str) -> np.ndarray:
        if field.startswith("_"):
            raise AttributeError(field)
        col = np.array([getattr(p, field) for p in self._blocks], dtype=np.float64)
        setattr(self, field, col)
        return col

    def act(self, policy: str, modules: frozenset[str] = DEFAULT_SELECTIVE) -> np.ndarray:
        return np.array([p.act(policy, modules) for p in self._blocks], dtype=np.float64)

    def offloaded(self, policy: str, modules: frozenset[str], offload: frozenset[str]) -> np.ndarray:
        return np.array([p.offloaded(policy, modules, offload) for p in self._blocks], dtype=np.float64)


_IN_FLIGHT: dict[tuple, tuple[tuple[float, ...], float]] = {}


def _closed_in_flight(sched: str, pp: int, vpp: int, m: int) -> tuple[tuple[float, ...], float]:
    """(per rank, the schedule's closed-form in-flight micro-batches; the embedding's on rank 0), cached."""
    key = (sched, pp, vpp, m)
    hit = _IN_FLIGHT.get(key)
    if hit is None:
        if len(_IN_FLIGHT) > 65536:
            _IN_FLIGHT.clear()
        hit = _IN_FLIGHT[key] = (tuple(in_flight_microbatches(sched, pp, vpp, m, r) for r in range(pp)),
                                 _embedding_in_flight(sched, pp, vpp, m))
    return hit


class _RunValues(NamedTuple):
    """What the memory formula reads of a run besides its per-rank sums."""

    emb_if: float
    """The embedding's closed-form in-flight micro-batches (rank 0)."""
    d_dense: int
    """Non-expert optimizer/FSDP shard group: dp x cp."""
    d_exp: int
    """Expert parameters' shard group: expert data parallel."""
    grad_b: int
    """Bytes per gradient value."""
    fsdp: bool
    opt_sharded: bool
    """FSDP or the distributed optimizer."""
    fp8pg: bool
    """fp8_param_gather."""
    cache_coef: float
    """Weight-cache bytes per GEMM weight (FP8/FP4 copies), 0 without one."""
    fsdp_per: float
    """FSDP: bytes per parameter of the gathered units."""
    seq: float
    """Tokens per micro-batch in sequence-parallel regions."""
    hidden: int
    moe_b: float
    """The MoE token-dispatch buffers' bytes (0: none)."""
    moe_has: bool
    """The run has MoE dispatch buffers."""
    cached: bool
    """The run keeps a weight cache or FSDP gathered units (an ``other`` part)."""
    cache_name: str
    """That part's name ('' when none)."""
    moe_name: str
    """The MoE buffers' part name ('' when none)."""


_RUN_FIELDS = _RunValues._fields[:13]
"""The numeric fields (what the batch stacks into arrays)."""


def _run_terms(run: RunConfig, assumptions: MemoryAssumptions
               ) -> tuple[_RankSums, tuple[float, ...], _RunValues]:
    """What the memory formula reads of one run: its per-rank sums, the closed-form in-flight counts per rank,
    and its other values."""
    s = shape_of(run, assumptions)
    return (_rank_sums(run, s, assumptions), *_run_values(run, s, assumptions))


def _run_values(run: RunConfig, s: Shape, assumptions: MemoryAssumptions
                ) -> tuple[tuple[float, ...], _RunValues]:
    """The closed-form in-flight counts per rank of ``run`` (shape ``s``), and its other values."""
    t, card = run.training, run.model
    lay = Layout(run)
    f_closed, emb_if = _closed_in_flight(t.schedule, t.pp, t.vpp, max(1, lay.num_microbatches))
    grad_b = BYTES_GRAD if t.grad_reduce_in_fp32 else BYTES_GRAD_BF16
    fp8_copy = 1.0 + (1.0 / 32 if t.fp8_recipe == "mxfp8" else 0.0)  # an FP8 weight copy (+ MXFP8's scale per 32)
    name, coef, per = "", 0.0, 0
    shards = t.fsdp and not t.fsdp_keeps_unsharded  # held sharded between uses (else whole for the step)
    if shards:
        per = assumptions.fsdp_prefetch_units * BYTES_WEIGHT
        per += grad_b if assumptions.fsdp_unsharded_grad else 0
        name = "fsdp_unsharded_units"
    elif t.precision == "fp8" and t.fp8_param_gather:
        # FP8 parameters: the row-wise FP8 data replaces the BF16 weight (params below), the
        # column-wise copy stays (Megatron --fp8-param-gather with Transformer Engine FP8 tensors)
        copies = _fp8_weight_copies(run)
        if copies > 1:
            name, coef = "fp8_weight_cache", (copies - 1) * fp8_copy
    elif t.precision == "fp8" and assumptions.fp8_weight_cache:
        name, coef = "fp8_weight_cache", _fp8_weight_copies(run) * fp8_copy  # row-wise + column-wise FP8 copies
    elif t.precision == "nvfp4" and assumptions.fp8_weight_cache:
        # row-wise + column-wise NVFP4 copies: 0.5 B per value + one fp8 scale per 16 values each
        # (2 x gemm x 0.5625 == 1.125 x gemm exactly: a power-of-two factor moved)
        name, coef = "fp4_weight_cache", 2 * (0.5 + 1 / 16)
    common = _moe_buffers(run, s, lay, assumptions)
    values = (emb_if, lay.dp * t.cp,  # non-expert optimizer/FSDP shard group: dp x cp
              lay.edp,  # expert params: expert data parallel
              grad_b, shards, t.fsdp or t.use_distributed_optimizer, t.fp8_param_gather, coef, per,
              s.seq_tokens, card.hidden_size, common[0][1] if common else 0.0, bool(common))
    return f_closed, _RunValues(*values, bool(name), name, common[0][0] if common else "")


def _fp8_weight_copies(run: RunConfig) -> int:
    """FP8 copies Transformer Engine keeps of a weight: row-wise and column-wise; one buffer serving both for a
    per-tensor recipe (delayed, tensorwise) on a part whose FP8 GEMMs take any layout (Float8Quantizer: no
    ``_transpose`` when ``is_non_tn_fp8_gemm_supported``, TE 2.x float8_tensor.py / quantizer.cpp)."""
    t = run.training
    return 1 if t.fp8_recipe in ("delayed", "tensorwise") and run.cluster.hardware.fp8_any_layout else 2


class _Scalar:
    """Elementwise choices on Python floats (one rank of one run)."""

    @staticmethod
    def where(c, a, b):
        return a if c else b

    minimum = staticmethod(min)
    maximum = staticmethod(max)


def _stage_formula(xp, S, R, f, f_closed, given: bool):
    """The memory of a pipeline rank: ``S`` its per-rank sums (``_RankSums`` fields), ``R`` its run's values
    (``_RUN_FIELDS``), ``f`` / ``f_closed`` its in-flight micro-batches (given, closed form). Python floats (``xp``
    = ``_Scalar``: one rank) or numpy arrays over (runs, ranks) (``xp`` = numpy): the same operations in the same
    order, so the same bits. Returns (params, grads, optimizer, activations, [(part, bytes, present)])."""
    # the embedding's in-flight count follows the simulator's rank-0 peak in proportion
    scale = xp.where(f_closed != 0, f / xp.where(f_closed != 0, f_closed, 1.0), 1.0) if given else 1.0
    out_mult = xp.minimum(1.0, f) if given else 1.0  # F then B right away
    edge = xp.where(S.has_emb, R.emb_if * scale, 0.0) * S.emb_act + out_mult * S.head_act + out_mult * S.mtp_act
    w_dense = xp.where(R.fsdp, S.p_dense / R.d_dense, S.p_dense)
    w_exp = xp.where(R.fsdp, S.p_exp / R.d_exp, S.p_exp)
    o_dense = xp.where(R.opt_sharded, S.p_dense / R.d_dense, S.p_dense)
    o_exp = xp.where(R.opt_sharded, S.p_exp / R.d_exp, S.p_exp)
    params = BYTES_WEIGHT * (w_dense + w_exp) - xp.where(R.fp8pg, S.gemm, 0.0)
    grads = R.grad_b * (w_dense + w_exp)
    optimizer = S.opt_bytes * (o_dense + o_exp)
    activations = f * S.layer_act + edge
    other = [("loss_fp32_softmax", x, x_in) for x, x_in in S.loss]
    other.append(("recompute_buffer", S.remat, S.remat != 0))
    # layer graphs: static buffers per region and micro-batch in flight (oracle.cuda_graphs); a whole-iteration
    # graph allocates in one pool what the eager run allocates (no regions counted)
    other.append(("cuda_graph_buffers", STATIC_BUFFERS_PER_REGION * S.graph_regions * xp.maximum(1.0, f) * R.seq
                  * R.hidden * BF16, S.graph_regions != 0))
    other.append((R.cache_name, xp.where(R.cached, xp.where(R.fsdp, S.largest_unit * R.fsdp_per,
                                                              R.cache_coef * S.gemm), 0.0), R.cached))
    moe_in = S.has_moe & R.moe_has
    other.append((R.moe_name, xp.where(moe_in, R.moe_b, 0.0), moe_in))
    return params, grads, optimizer, activations, other


class _NS:
    """Attribute access over a dict (the formula's inputs)."""

    def __init__(self, d: dict) -> None:
        self.__dict__.update(d)


def _columns(values: Sequence, n: int) -> np.ndarray:
    """``(n, len(values))``: column j is ``values[j]`` (an array over the n runs, or one number for all)."""
    out = np.empty((n, len(values)))
    for j, v in enumerate(values):
        out[:, j] = v
    return out


def _batch_terms(runs: Sequence[RunConfig], assumptions: MemoryAssumptions) -> tuple:
    """:func:`_run_terms` of runs of one pp, as arrays over (runs, ranks): the ``N_NUMERIC`` sums (n, pp, fields),
    has_emb and has_moe (n, pp), the loss scratch as [(bytes, present) per chunk with heads] of (n, pp) arrays, the
    closed-form in-flight counts (n, pp), and each run's :class:`_RunValues`. Sums already computed are read; the
    others are :func:`_sums_formula` over arrays, once per placement and policies for all their shapes."""
    n, pp = len(runs), runs[0].training.pp
    nums = np.empty((n, pp, N_NUMERIC))
    has_emb, has_moe = np.empty((n, pp), dtype=bool), np.empty((n, pp), dtype=bool)
    f = []
    losses: list[tuple] = []  # (rows, rank, chunk-with-heads index, bytes)
    values, hit_rows, hits = [], [], []
    earlier: dict[int, tuple[_BatchRow, list[int], list[int]]] = {}  # an earlier batch's rows: here, there
    misses: dict[tuple, tuple[RunConfig, list[int], list[Shape], list[tuple]]] = {}
    for i, run in enumerate(runs):
        s = shape_of(run, assumptions)
        key = _sums_key(run, s)
        hit = _SUMS.get(key)
        if type(hit) is tuple:
            hit_rows.append(i)
            hits.append(hit)
            for r, rk in enumerate(hit):
                losses += [(i, r, j, x) for j, (x, _) in enumerate(rk.loss)]
        elif hit is not None:
            there = earlier.get(id(hit.nums))
            if there is None:
                there = earlier[id(hit.nums)] = (hit, [], [])
            there[1].append(i)
            there[2].append(hit.row)
        else:
            group = misses.get(gkey := key[:1] + key[2:])  # the same placement and policies: one formula
            if group is None:
                group = misses[gkey] = (run, [], [], [])
            group[1].append(i)
            group[2].append(s)
            group[3].append(key)
        f_closed, v = _run_values(run, s, assumptions)
        f.append(f_closed)
        values.append(v)
    if hits:
        nums[hit_rows] = [[rk[:N_NUMERIC] for rk in x] for x in hits]
        has_emb[hit_rows] = [[rk.has_emb for rk in x] for x in hits]
        has_moe[hit_rows] = [[rk.has_moe for rk in x] for x in hits]
    for run, rows, shapes, keys in misses.values():
        b = _BlockColumns([blocks(run.model, s) for s in shapes])
        tokens = np.array([s.tokens for s in shapes], dtype=np.float64)
        tp = np.array([s.graph.tp for s in shapes], dtype=np.int64)
        per_rank = _sums_formula(np, run, b, tokens, tp, assumptions)
        group_nums = np.empty((len(rows), pp, N_NUMERIC))
        for r, (rank_nums, *_) in enumerate(per_rank):
            for j, v in enumerate(rank_nums):
                group_nums[:, r, j] = v
        flags = tuple((emb, moe) for _, emb, moe, _, _ in per_rank)
        group_losses = tuple(tuple(loss) for _, _, _, loss, _ in per_rank)
        group_acts = tuple(_columns(acts, len(rows)) for _, _, _, _, acts in per_rank)
        if len(_SUMS) + len(keys) > _SUMS_MAX:
            _SUMS.clear()
        entries = [_BatchRow(group_nums, flags, group_losses, group_acts, k) for k in range(len(keys))]
        _SUMS.update(zip(keys, entries))  # kept for a projection of these runs (_rank_sums) and the next batch
        earlier[id(group_nums)] = (entries[0], rows, list(range(len(rows))))  # read back as an earlier batch's
    for e, rows, ks in earlier.values():
        nums[rows] = e.nums[ks]
        for r, ((emb, moe), loss) in enumerate(zip(e.flags, e.losses)):
            has_emb[rows, r], has_moe[rows, r] = emb, moe
            losses += [(rows, r, j, x[ks]) for j, x in enumerate(loss)]
    k_loss = 1 + max((j for _, _, j, _ in losses), default=-1)
    loss_parts = [(np.zeros((n, pp)), np.zeros((n, pp), dtype=bool)) for _ in range(k_loss)]
    for rows, r, j, x in losses:
        loss_parts[j][0][rows, r] = x
        loss_parts[j][1][rows, r] = True
    return nums, has_emb, has_moe, loss_parts, np.array(f, dtype=np.float64), values


def memory_peaks(runs: Sequence[RunConfig], *, assumptions: MemoryAssumptions = DEFAULT
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(peak bytes, cap bytes) per run of ``runs``: ``project_memory(run, trees='none')``'s ``peak_bytes`` and
    ``cap_bytes`` of each, bit for bit (the same ``_stage_formula``), computed for the runs of one pp at once with
    numpy over (runs, ranks): the pre-filter of a batch of configurations."""
    peaks = np.empty(len(runs))
    caps = np.array([r.cluster.memory_cap_bytes for r in runs], dtype=np.float64)
    by_pp: dict[int, list[int]] = {}
    for i, r in enumerate(runs):
        by_pp.setdefault(r.training.pp, []).append(i)
    for idx in by_pp.values():
        nums, has_emb, has_moe, loss, f, values = _batch_terms([runs[i] for i in idx], assumptions)
        S = {k: nums[:, :, j] for j, k in enumerate(_Rank._fields[:N_NUMERIC])}
        S["has_emb"], S["has_moe"], S["loss"] = has_emb, has_moe, loss
        vals = np.array([v[:len(_RUN_FIELDS)] for v in values], dtype=np.float64)  # (n, fields)
        R = {k: vals[:, j:j + 1] for j, k in enumerate(_RUN_FIELDS)}
        for k in ("fsdp", "opt_sharded", "fp8pg", "moe_has"):
            R[k] = R[k] != 0
        R["cached"] = np.array([[v.cached] for v in values])
        R["cache_name"], R["moe_name"] = "weight_cache", "moe_buffers"  # per run: the names only label parts
        params, grads, optimizer, activations, other = _stage_formula(np, _NS(S), _NS(R), f, f, False)
        total = params + grads + optimizer + activations
        if other:
            o = other[0][1]
            for _, v, _ in other[1:]:  # StageMemory.other_bytes: the present parts summed in order (absent: 0)
                o = o + v
            total = total + o
        peaks[idx] = total.max(axis=1)
    return peaks, caps


def project_memory(run: RunConfig, *, in_flight: Sequence[float] | None = None,
                   assumptions: MemoryAssumptions = DEFAULT, trees: str = "worst") -> MemoryBreakdown:
    """Per-GPU memory of every pipeline rank of ``run``.

    ``in_flight[rank]`` overrides the schedule's closed-form in-flight micro-batch count (units of the
    rank's full per-micro-batch activation), e.g. with the pipeline simulator's exact peaks.
    ``trees``: 'worst' attaches the module tree to the worst rank only, 'all' to every rank, 'none'.
    Each rank is :func:`_stage_formula` on floats, the formula :func:`memory_peaks` runs over arrays.
    """
    if trees not in ("worst", "all", "none"):
        raise InvalidConfigError(f"trees={trees!r} must be 'worst', 'all' or 'none'")
    pp = run.training.pp
    if in_flight is not None and (len(in_flight) != pp or any(x < 0 for x in in_flight)):
        raise InvalidConfigError(f"in_flight={list(in_flight)!r} must hold {pp} non-negative values (one per pipeline rank)")
    sums, f_closed, R = _run_terms(run, assumptions)
    stages = []
    for r in range(pp):
        S = sums[r]
        fc = f_closed[r]
        f = float(in_flight[r]) if in_flight is not None else fc
        params, grads, opt, act, parts = _stage_formula(_Scalar, S, R, f, fc, in_flight is not None)
        other = tuple([(name, v) for name, v, present in parts if present])
        stages.append(StageMemory(
            rank=r, params_bytes=params, grads_bytes=grads, optimizer_bytes=opt, activations_bytes=act,
            other_bytes=sum(v for _, v in other), in_flight_microbatches=f, other_breakdown=other))
    if trees != "none":
        worst = max(stages, key=lambda x: x.total_bytes).rank
        stages = [_with_tree(st, run, assumptions) if trees == "all" or st.rank == worst else st for st in stages]
    hw = run.cluster.hardware
    return MemoryBreakdown(stages=tuple(stages), cap_bytes=run.cluster.memory_cap_bytes,
                           runtime_reserved_bytes=hw.runtime_reserved_bytes, hbm_bytes=hw.hbm_capacity_bytes)


def offloaded_bytes_per_microbatch(run: RunConfig, assumptions: MemoryAssumptions = DEFAULT, rank: int = 0) -> float:
    """Bytes Megatron-Core's CPU offloading moves to host memory per micro-batch (and back in its backward) on
    pipeline rank ``rank``: the saved activations of the first ``cpu_offloading_num_layers`` decoder layers of the
    (single) pipeline stage, and with ``cpu_offloading_weights`` their weights; under fine-grained activation
    offloading (``offload_modules``) what those modules save in each of the rank's decoder layers."""
    t = run.training
    if t.offload_modules:
        b = blocks(run.model, shape_of(run, assumptions))
        return sum(n * b.layer(kind).offloaded(pol, _modules(run), _offload(run))
                   for ch in _plans(run)[rank] for kind, pol, n in ch.layers)
    if not t.cpu_offloading or not t.cpu_offloading_num_layers:
        return 0.0
    b = blocks(run.model, shape_of(run, assumptions))
    kinds = run.model.layer_kinds[:t.cpu_offloading_num_layers]
    act = sum(b.layer(k).act("none") for k in kinds)
    weights = sum(BYTES_WEIGHT * b.layer(k).params for k in kinds) if t.cpu_offloading_weights else 0.0
    return act + weights


def _moe_buffers(run: RunConfig, s: Shape, lay: Layout, a: MemoryAssumptions) -> list[tuple[str, float]]:
    """Token-dispatch buffers of a rank that hosts MoE layers."""
    card, t = run.model, run.training
    if not card.is_moe:
        return []
    h = card.expert_width  # what the dispatcher moves per token (a latent MoE's latent width)
    if t.moe_a2a_backend == "hybridep":
        # HybridEP's registered buffers hold the dispatched tokens of one layer: the static budget's rows (or the
        # busiest rank's under dynamic sizing), H bf16 each, for the dispatch and again for the combine (estimate
        # from Megatron-Core's init_hybrid_ep_buffer sizing by hidden size and tokens)
        rows = card.moe_topk * s.seq_tokens * t.moe_buffer_load
        return [("hybridep_buffers", 2 * rows * h * BF16)]
    if t.moe_a2a_backend == "deepep":
        # DeepEP registers fixed NVLink (+ RDMA across nodes) buffers at start-up, sized in tokens of
        # H bf16 values per peer (DeepEP get_nvl_buffer_size_hint / get_rdma_buffer_size_hint)
        g = lay.group("ep")
        gpn = run.cluster.hardware.gpus_per_node
        nvl = g.members_per_block(gpn) * a.deepep_nvl_tokens_per_peer * h * BF16
        nodes = g.blocks_spanned(gpn)
        rdma = nodes * a.deepep_rdma_tokens_per_node * h * BF16 if nodes > 1 else 0.0
        return [("deepep_buffers", nvl + rdma)]
    # all-to-all: the permuted k x T_r x H send buffer lives until the dispatch completes
    return [("a2a_dispatch_buffer", card.moe_topk * s.seq_tokens * h * BF16)]


# ---------------------------------------------------------------------------------- trees
def _tensor_nodes(blk: Block, n: int, policy: str, mods: frozenset[str],
                  offload: frozenset[str] = frozenset()) -> tuple[MemoryNode, ...]:
    kids = []
    for mod in blk.modules:
        if policy in ("checkpoint", "op_sac"):
            tensors = ()
        else:
            by = mod.recomputed_by or (frozenset(),) * len(mod.tensors)
            off = mod.offloaded_by or (frozenset(),) * len(mod.tensors)
            # a tensor fine-grained offloading moves waits in host memory: not listed
            tensors = tuple(MemoryNode(name=x.name, activation_bytes=n * x.bytes)
                            for x, d, o in zip(mod.tensors, by, off)
                            if not (policy == "selective" and mods & d) and not (offload & o))
        kids.append(MemoryNode(name=mod.name, params=n * mod.params,
                               activation_bytes=sum(c.activation_bytes for c in tensors), children=tensors))
    if policy in ("checkpoint", "op_sac"):
        kids.append(MemoryNode(name="checkpointed_input", activation_bytes=n * blk.checkpoint_bytes))
    if policy == "op_sac":
        kids.append(MemoryNode(name="saved_op_outputs", activation_bytes=n * (blk.act_op_sac - blk.checkpoint_bytes)))
    return tuple(kids)


_NODES: dict[tuple, tuple[Block, MemoryNode]] = {}
"""Block nodes by (id of the block, count, policy, label, modules), with the block (so its id stays its own): the
chunks of a rank repeat the same layers, and the nodes are immutable."""


def _block_node(blk: Block, n: int = 1, policy: str = "none", label: str | None = None,
                mods: frozenset[str] = frozenset(), offload: frozenset[str] = frozenset()) -> MemoryNode:
    key = (id(blk), n, policy, label, mods, offload)
    hit = _NODES.get(key)
    if hit is not None and hit[0] is blk:
        return hit[1]
    kids = _tensor_nodes(blk, n, policy, mods, offload)
    params, act = sum(k.params for k in kids), sum(k.activation_bytes for k in kids)
    if len(kids) == 1:  # a one-module block (the embedding): its tensors directly
        kids = kids[0].children
    node = MemoryNode(name=label or blk.name, params=params, activation_bytes=act, children=kids)
    if len(_NODES) > 4096:
        _NODES.clear()
    _NODES[key] = (blk, node)
    return node


def module_tree(run: RunConfig, rank: int, *, assumptions: MemoryAssumptions = DEFAULT) -> MemoryNode:
    """Per-module tree of pipeline rank ``rank``: parameters held on one GPU (TP/EP-sharded, before
    FSDP) and activations saved for ONE micro-batch of every chunk (under the recompute policy)."""
    t = run.training
    if not 0 <= rank < t.pp:
        raise InvalidConfigError(f"rank={rank} must be in 0..pp-1 = 0..{t.pp - 1}")
    b = blocks(run.model, shape_of(run, assumptions))
    mods, offl = _modules(run), _offload(run)
    chunk_nodes = []
    for ch in _plans(run)[rank]:
        kids = []
        if ch.has_embedding:
            kids.append(_block_node(b.embedding))
        for kind, pol, n in ch.layers:
            sel = "" if mods == DEFAULT_SELECTIVE else f" ({', '.join(sorted(mods))})"
            tag = {"none": "", "selective": f", selective recompute{sel}", "op_sac": ", op-level selective checkpointing",
                   "checkpoint": ", full recompute"}[pol]
            if offl:
                tag += f", offloaded ({', '.join(sorted(offl))})"
            kids.append(_block_node(b.layer(kind), n, pol, label=f"{kind}_layer x{n}{tag}", mods=mods, offload=offl))
        if ch.has_output:
            kids.append(_block_node(_head(b, run, ch)))
        if ch.mtp and b.mtp is not None and b.mtp_head is not None:
            extra = _extra_embedding_params(b, run, ch)
            if extra:
                kids.append(MemoryNode(name="mtp_weight_copies", params=extra))
            kids += [_block_node(b.mtp, 1, _mtp_policy(run), mods=mods), _block_node(b.mtp_head)]
        chunk_nodes.append(MemoryNode(name=f"chunk{ch.chunk} (virtual stage {ch.virtual_stage})",
                                      params=sum(k.params for k in kids),
                                      activation_bytes=sum(k.activation_bytes for k in kids), children=tuple(kids)))
    return MemoryNode(name=f"pp_rank{rank}", params=sum(k.params for k in chunk_nodes),
                      activation_bytes=sum(k.activation_bytes for k in chunk_nodes), children=tuple(chunk_nodes))


def _with_tree(st: StageMemory, run: RunConfig, a: MemoryAssumptions) -> StageMemory:
    from dataclasses import replace
    return replace(st, tree=module_tree(run, st.rank, assumptions=a))
