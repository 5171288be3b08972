"""The seed planner (paper Sec. 3.2 and Appendix C.1): single-axis sweeps anchored on the baseline.

Every candidate changes one axis of the user's baseline (or one coupled pair: schedule and VPP),
so each single-axis improvement is directly attributable. Axes are visited in the paper's order:

1. memory frontier: recompute full -> selective -> none;
1b. number format: every format of the space's precision axis other than the baseline's, lowest bit width
   first (FP8 and, on parts with FP4 tensor cores, NVFP4): on the GEMM-bound part of a step a format moves
   throughput more than any single layout step, so it is tried before the second-order axes;
2. MoE dispatcher: all-to-all vs DeepEP (MoE models with EP > 1 only); CUDA graphs where the space
   searches them (widest scope first: an illegal one, a dropless MoE layer, is skipped);
3. pipeline bubble: 1F1B, interleaved with VPP in {2, 3, 4}, zero-bubble, ILP (PP > 1 only);
4. second-order axes: micro-batch size in {baseline, 1, 2}, then the distributed-optimizer flag.

When these leave room under ``max_candidates`` (a baseline with no recompute and one legal VPP has
only about nine), the plan fills up the way the public planner does (notes Sec. 1.5): FSDP, the
ZBV schedule, then one step on each layout axis (EP, TP, PP, CP).

The baseline itself comes first. Moves equal to the baseline, outside the space, or illegal (e.g.
a VPP that does not divide the layers per stage) are skipped; memory is left to the pre-filter.
At most ``max_candidates`` (12, as in the paper) are emitted.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchers.base import Candidate
from searchers.space import SearchSpace

PROPOSER = "seed-planner"
_FORMAT_BITS = {"nvfp4": 4, "mxfp4": 4, "fp4": 4, "fp8": 8, "mxfp8": 8, "bf16": 16, "fp16": 16, "fp32": 32}


def _bits(precision: str) -> tuple[int, str]:
    """Sort key: bit width of a training number format (unknown names last), then the name."""
    return (_FORMAT_BITS.get(str(precision).lower(), 64), str(precision))


def _moves(space: SearchSpace, anchor: Mapping[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    t = space.baseline.training if anchor is None else space.make(anchor).training
    m = space.baseline.model
    moves: list[tuple[str, dict[str, Any]]] = [("baseline", {})]
    for r in ("full", "selective", "none"):
        moves.append((f"recompute={r}", {"recompute": r, "recompute_num_layers": None}))
    for p in sorted(space.values.get("precision", []), key=_bits):
        if p != t.precision:
            moves.append((f"precision={p}", {"precision": p}))
    if m.is_moe and t.ep > 1:
        for b in ("alltoall", "deepep", *(b for b in space.values.get("moe_a2a_backend", ())
                                           if b not in ("alltoall", "deepep"))):  # hybridep: --allow software
            moves.append((f"moe_a2a_backend={b}", {"moe_a2a_backend": b}))
        # paper App. H MoE priority: (1) DeepEP, (2) sync-free MoE
        moves.append(("moe_sync_free=true", {"moe_a2a_backend": "deepep", "moe_sync_free": True}))
        # searched only when the space opens them (allow: software, or restricted in; docs/search.md)
        for flag in ("moe_a2a_overlap", "moe_shared_expert_overlap", "moe_router_fusion", "fused_grouped_mlp"):
            if True in space.values.get(flag, ()) and not getattr(t, flag):
                moves.append((f"{flag}=true", {flag: True}))
    if True in space.values.get("fp8_param_gather", ()) and not t.fp8_param_gather:
        moves.append(("fp8_param_gather=true", {"fp8_param_gather": True}))
    # host overhead: CUDA graphs, searched only when restricted in (docs/search.md); widest scope first
    for impl in space.values.get("cuda_graph_impl", ()):
        for scope in sorted(space.values.get("cuda_graph_scope", ((),)), key=lambda sc: (bool(sc), -len(sc))):
            if impl != "none" and (impl, tuple(scope)) != (t.cuda_graph_impl, t.cuda_graph_scope):
                label = f"cuda_graph_impl={impl} scope={'+'.join(scope) or 'layer'}"
                moves.append((label, {"cuda_graph_impl": impl, "cuda_graph_scope": tuple(scope)}))
    if t.pp > 1:
        moves.append(("pp_schedule=1f1b", {"pp_schedule": "1f1b", "vpp": 1}))
        for v in (2, 3, 4):
            moves.append((f"pp_schedule=interleaved vpp={v}", {"pp_schedule": "interleaved", "vpp": v}))
        moves.append(("pp_schedule=zero_bubble", {"pp_schedule": "zero_bubble", "vpp": 1}))
        moves.append(("pp_schedule=ilp", {"pp_schedule": "ilp", "vpp": 1}))
    for mbs in (t.mbs, 1, 2):
        moves.append((f"mbs={mbs}", {"mbs": mbs}))
    moves.append((f"use_distributed_optimizer={not t.use_distributed_optimizer}".lower(),
                  {"use_distributed_optimizer": not t.use_distributed_optimizer}))
    # fill-up (public planner, notes Sec. 1.5): FSDP, the V schedule, then the layout
    moves.append(("fsdp=true", {"fsdp": True, "use_distributed_optimizer": False}))
    if t.pp > 1:
        moves.append(("pp_schedule=zbv vpp=2", {"pp_schedule": "zbv", "vpp": 2}))
    base = space.point_of(space.baseline) if anchor is None else dict(anchor)
    for axis in ("ep", "tp", "pp", "cp"):
        if axis in space.axes:
            for v in space.neighbours(base, axis):
                moves.append((f"{axis}={v}", {axis: v}))
    return moves


def seed_plan(space: SearchSpace, *, max_candidates: int = 12,
              anchor: Mapping[str, Any] | None = None) -> list[Candidate]:
    """The seed candidates for ``space`` in paper order (baseline first); each carries its move.

    ``anchor``: a point of the space to plan around instead of the baseline (its moves are labelled
    relative to it; the first candidate, the anchor itself, is labelled 'anchor')."""
    out: list[Candidate] = []
    seen: set[str] = set()
    start = space.point_of(space.baseline) if anchor is None else dict(anchor)
    for label, move in _moves(space, anchor):
        if len(out) >= max_candidates:
            break
        run, problems = space.validate({**start, **move})
        if problems or run is None:
            continue
        key = run.key()
        if key in seen:
            continue
        seen.add(key)
        if anchor is not None and label == "baseline":
            label = "anchor"
        changed = {k: v for k, v in space.point_of(run).items() if v != start[k]}
        out.append(Candidate(values=space.point_of(run), phase="seed", round=0, proposer=PROPOSER,
                             note=label, meta={"move": changed}))
    return out
