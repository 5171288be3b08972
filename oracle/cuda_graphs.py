"""CUDA graphs (Megatron-Core ``--cuda-graph-impl`` / ``--cuda-graph-scope``): which ops of a decoder layer
are captured, and what capturing changes.

A captured region is recorded once and replayed with one launch: the host no longer issues its ops one by
one (no Python, no autograd node, no per-expert C++ launch loop), so a host-bound pass (small kernels:
fine-grained MoE at small micro-batches) runs at the device's pace. What stays on the host per region and
pass is the graphed callable itself (GRAPH_REPLAY_HOST_OPS). A graph cannot contain a device-to-host sync,
so the MoE dispatcher of a dropless run (token counts read on the host every forward) can only be captured
up to the router; the whole MoE block needs static shapes (drop-and-pad) or a sync-free dispatcher.

Scopes (Megatron-Core TransformerConfig ``cuda_graph_scope``; an empty list or ``full`` is the whole layer):

=================  ==================================================================================
attn               the attention block: input norm, QKV/MLA projections, RoPE, core attention, output
                   projection, residual add (TransformerLayer._forward_attention)
mlp                a dense layer's MLP block: pre-MLP norm, MLP, residual add
moe_router         a MoE layer's pre-MLP norm, router and top-k (the part before the dispatcher's sync)
moe_preprocess     the dispatcher's preprocessing (token counts, permutation metadata) with the router:
                   in this op graph the counts are part of the router's top-k op, so it captures what
                   moe_router does
moe                the whole MoE block (router, dispatch, experts, shared experts, combine)
mamba              a hybrid model's Mamba-2 layer (norm, in_proj, scan, gated norm, out_proj, residual add)
full_iteration     the forward and backward of every micro-batch as one graph (``local`` only)
=================  ==================================================================================

Device time is left as eager prices it: inside a graph the gap between back-to-back kernels shrinks
(~1-2 us instead of the eager launch gap), which this model does not credit (conservative for graphs of
many tiny kernels).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from oracle.model_card import MOE_KINDS
from oracle.opgraph import ATTN, EXPERTS, MAMBA, MLP, ROUTER

if TYPE_CHECKING:
    from oracle.config import TrainingConfig

CudaGraphImpl = Literal["none", "local", "transformer_engine", "full_iteration"]
"""Megatron-Core ``--cuda-graph-impl``: none; local = Megatron-Core's own CudaGraphManager; transformer_engine =
Transformer Engine's make_graphed_callables; full_iteration = one graph for the whole forward/backward of an
iteration (Megatron-Core 0.16+ spelling of local + scope full_iteration, which older releases use)."""
CudaGraphScope = Literal["full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]
"""A Megatron-Core ``--cuda-graph-scope`` value (``full``: the whole layer, also what an empty list means)."""
CUDA_GRAPH_SCOPES: tuple[str, ...] = get_args(CudaGraphScope)

GRAPH_REPLAY_HOST_OPS = 2
"""Framework ops the host still issues per captured region and pass: the graphed callable's autograd Function
and the copy of the new input into the graph's static input buffer (Transformer Engine make_graphed_callables
``Graphed.forward``/``backward``; Megatron-Core's CudaGraphManager runner likewise)."""
STATIC_BUFFERS_PER_REGION = 2
"""Activation-sized buffers (T x H, bf16) a layer-level graph holds beyond what the eager run keeps, per
micro-batch it may have in flight: the forward copies its input into a static input buffer and the backward
its incoming gradient into a static buffer (TE make_graphed_callables ``Graphed``: ``static_input_surface``
and ``static_grad_outputs`` ``copy_``); outputs are handed on as views. Estimate: pool fragmentation across
graphs is not modelled."""

_WHOLE = {"dense": frozenset({ATTN, MLP}), "moe": frozenset({ATTN, ROUTER, EXPERTS}), "mamba": frozenset({MAMBA}),
          "gdn": frozenset({ATTN}),
          "attention": frozenset({ATTN}), "mlp": frozenset({MLP}), "moe_mlp": frozenset({ROUTER, EXPERTS})}
"""Every op block of a layer of each kind (oracle.model_card.LAYER_KINDS)."""


def scopes(t: TrainingConfig) -> frozenset[str]:
    """The configured scopes, 'full' for the whole layer (an empty list)."""
    return frozenset(t.cuda_graph_scope) or frozenset({"full"})


def full_iteration(t: TrainingConfig) -> bool:
    """The whole forward/backward of an iteration is one graph (impl full_iteration, or local with scope
    full_iteration)."""
    return t.cuda_graph_impl == "full_iteration" or (t.cuda_graph_impl != "none" and "full_iteration" in scopes(t))


def layer_regions(t: TrainingConfig, kind: str) -> tuple[frozenset[str], ...]:
    """The captured regions of one decoder layer of ``kind`` (oracle.model_card.LAYER_KINDS), each a set of op blocks
    (``Op.block``) replayed as one graph; empty without CUDA graphs. Under ``full_iteration`` the whole layer
    is one region (its replay is once per iteration, see ``replays_per_layer``)."""
    if t.cuda_graph_impl == "none":
        return ()
    sc = scopes(t)
    if full_iteration(t) or "full" in sc:
        return (_WHOLE[kind],)
    regions = []
    if "attn" in sc and ATTN in _WHOLE[kind]:
        regions.append(frozenset({ATTN}))
    if kind == "mamba" and "mamba" in sc:
        regions.append(frozenset({MAMBA}))
    if kind in ("dense", "mlp") and "mlp" in sc:
        regions.append(frozenset({MLP}))
    if kind in MOE_KINDS:
        if "moe" in sc:
            regions.append(frozenset({ROUTER, EXPERTS}))
        elif sc & {"moe_router", "moe_preprocess"}:
            regions.append(frozenset({ROUTER}))
    return tuple(regions)


def captured_blocks(t: TrainingConfig, kind: str) -> frozenset[str]:
    """Every op block of a ``kind`` layer that runs inside a graph."""
    return frozenset().union(*layer_regions(t, kind))


def replays_per_layer(t: TrainingConfig, kind: str) -> int:
    """Graph replays the host issues per layer and pass (0 under full_iteration: one per iteration)."""
    return 0 if full_iteration(t) else len(layer_regions(t, kind))
