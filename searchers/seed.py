"""The seed planner (paper Sec. 3.2 and Appendix C.1): single-axis sweeps anchored on the baseline.

Every candidate changes one axis of the user's baseline (or one coupled pair: schedule and VPP),
so each single-axis improvement is directly attributable. Axes are visited in the paper's order:

1. memory frontier: recompute full -> selective -> none;
2. MoE dispatcher: all-to-all vs DeepEP (MoE models with EP > 1 only);
3. pipeline bubble: 1F1B, interleaved with VPP in {2, 3, 4}, zero-bubble, ILP (PP > 1 only);
4. second-order axes: micro-batch size in {baseline, 1, 2}, then the distributed-optimizer flag.

When these leave room under ``max_candidates`` (a baseline with no recompute and one legal VPP has
only about nine), the plan fills up the way the public planner does (notes Sec. 1.5): FP8, FSDP, the
ZBV schedule, then one step on each layout axis (EP, TP, PP, CP).

The baseline itself comes first. Moves equal to the baseline, outside the space, or illegal (e.g.
a VPP that does not divide the layers per stage) are skipped; memory is left to the pre-filter.
At most ``max_candidates`` (12, as in the paper) are emitted.
"""
from __future__ import annotations

from typing import Any

from searchers.base import Candidate
from searchers.space import SearchSpace

PROPOSER = "seed-planner"


def _moves(space: SearchSpace) -> list[tuple[str, dict[str, Any]]]:
    t = space.baseline.training
    m = space.baseline.model
    moves: list[tuple[str, dict[str, Any]]] = [("baseline", {})]
    for r in ("full", "selective", "none"):
        moves.append((f"recompute={r}", {"recompute": r, "recompute_num_layers": None}))
    if m.is_moe and t.ep > 1:
        for b in ("alltoall", "deepep"):
            moves.append((f"moe_a2a_backend={b}", {"moe_a2a_backend": b}))
        # paper App. H MoE priority: (1) DeepEP, (2) sync-free MoE
        moves.append(("moe_sync_free=true", {"moe_a2a_backend": "deepep", "moe_sync_free": True}))
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
    # fill-up (public planner, notes Sec. 1.5): precision, FSDP, the V schedule, then the layout
    moves.append(("precision=fp8", {"precision": "fp8"}))
    moves.append(("fsdp=true", {"fsdp": True, "use_distributed_optimizer": False}))
    if t.pp > 1:
        moves.append(("pp_schedule=zbv vpp=2", {"pp_schedule": "zbv", "vpp": 2}))
    base = space.point_of(space.baseline)
    for axis in ("ep", "tp", "pp", "cp"):
        if axis in space.axes:
            for v in space.neighbours(base, axis):
                moves.append((f"{axis}={v}", {axis: v}))
    return moves


def seed_plan(space: SearchSpace, *, max_candidates: int = 12) -> list[Candidate]:
    """The seed candidates for ``space`` in paper order (baseline first); each carries its move."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for label, move in _moves(space):
        if len(out) >= max_candidates:
            break
        run, problems = space.validate(move)
        if problems or run is None:
            continue
        key = run.key()
        if key in seen:
            continue
        seen.add(key)
        changed = {k: v for k, v in space.point_of(run).items() if v != space.point_of(space.baseline)[k]}
        out.append(Candidate(values=space.point_of(run), phase="seed", round=0, proposer=PROPOSER,
                             note=label, meta={"move": changed}))
    return out
