"""Derived parallel layout: degrees, micro-batches, rank groups and the layer-to-stage map.

Rank order follows Megatron (tp fastest, then cp, dp, pp); the expert layout follows MoE parallel
folding (etp fastest, then ep, expert-dp, pp) so ``edp = num_gpus / (pp * ep * etp)``. Source:
Megatron-Core ``parallel_state.initialize_model_parallel``, default ``order="tp-cp-ep-dp-pp"`` for the
decoder ``RankGenerator`` (ep=1 there) and the expert ``RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp)``;
``--use-tp-pp-dp-mapping`` (order tp-cp-ep-pp-dp) is not modelled. Where each group's ranks sit on
scale-up domains and pods is decided from these strides (``GroupSpec``, ``oracle.comm.topology``).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache

from oracle.config import V_SCHEDULES, RunConfig


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A process group: ``size`` ranks spaced ``stride`` global ranks apart.

    Groups of one kind tile the job in windows of ``size * stride`` consecutive ranks (Megatron's
    rank order), one group per offset ``0 <= o < stride`` in each window: ``{base + o + i * stride}``.
    """

    kind: str
    size: int
    stride: int

    def members_per_block(self, block: int, num_gpus: int | None = None) -> int:
        """Fewest members any group of this kind has in one aligned block of ``block`` consecutive
        ranks (a scale-up domain, a host, a pod). Without ``num_gpus`` blocks and windows are taken as
        aligned; with it, groups that straddle a block boundary count (the worst group is returned)."""
        if num_gpus is None:
            if self.size <= 1 or self.stride >= block:
                return 1
            return max(1, min(self.size, block // self.stride))
        return min_members_per_block(num_gpus, self.size, self.stride, block)

    def blocks_spanned(self, block: int, num_gpus: int | None = None) -> int:
        """How many blocks (hosts, scale-up domains, pods) the worst group touches, at most."""
        return -(-self.size // self.members_per_block(block, num_gpus))


@lru_cache(maxsize=4096)
def min_members_per_block(num_gpus: int, size: int, stride: int, block: int) -> int:
    """Fewest members of any group ``{base + o + i*stride}`` (see ``GroupSpec``) found in one aligned
    block of ``block`` ranks, over every group of the job (ranks are packed block by block)."""
    n, s = size, stride
    if n <= 1:
        return 1
    if s >= block:
        return 1  # members at least a block apart: one per block
    window = n * s
    if num_gpus <= block or (window <= block and block % window == 0):
        return n  # every group inside one block
    if block % s == 0 and window % block == 0:
        return block // s  # aligned: every block holds block/s members
    period = window * block // math.gcd(window, block)
    limit = max(window, min(num_gpus, period))
    best = n
    for base in range(0, limit - window + 1, window):
        for o in range(s):
            counts = Counter((base + o + i * s) // block for i in range(n))
            best = min(best, min(counts.values()))
    return best


@dataclass(frozen=True)
class Layout:
    """Everything derived from a RunConfig that more than one model needs."""

    run: RunConfig

    @property
    def t(self):
        return self.run.training

    @property
    def num_gpus(self) -> int:
        return self.run.cluster.num_gpus

    @property
    def dp(self) -> int:
        t = self.t
        return self.num_gpus // (t.tp * t.pp * t.cp)

    @property
    def edp(self) -> int:
        """Expert data-parallel degree (MoE parallel folding)."""
        t = self.t
        return self.num_gpus // (t.pp * t.ep * t.etp)

    @property
    def num_microbatches(self) -> int:
        return self.t.gbs // (self.t.mbs * self.dp)

    @property
    def tokens_per_microbatch_per_rank(self) -> int:
        """Tokens one rank's activations cover in a micro-batch: mbs * seq / cp (before TP/SP split)."""
        return self.t.mbs * self.t.seq_len // self.t.cp

    # ------------------------------------------------------------------ groups
    def group(self, kind: str) -> GroupSpec:
        t = self.t
        if kind == "tp":
            return GroupSpec("tp", t.tp, 1)
        if kind == "cp":
            return GroupSpec("cp", t.cp, t.tp)
        if kind == "dp":
            return GroupSpec("dp", self.dp, t.tp * t.cp)
        if kind == "dp_cp":  # gradient reduction of non-expert params spans dp x cp
            return GroupSpec("dp_cp", self.dp * t.cp, t.tp)
        if kind == "pp":
            return GroupSpec("pp", t.pp, self.num_gpus // t.pp)
        if kind == "etp":
            return GroupSpec("etp", t.etp, 1)
        if kind == "ep":
            return GroupSpec("ep", t.ep, t.etp)
        if kind == "edp":
            return GroupSpec("edp", self.edp, t.etp * t.ep)
        raise KeyError(kind)

    # ------------------------------------------------------------------ stages
    @cached_property
    def stage_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """``stage_layers[rank][chunk]`` = decoder layer indices hosted there.

        Interleaved: virtual stage ``chunk * pp + rank``. V-shape schedules: rank r hosts virtual
        stages r and 2*pp-1-r. Uneven first/last counts come from the config, else the card.
        """
        return assign_layers(self.run)

    def recomputed_layers(self, rank: int, chunk: int) -> int:
        """How many leading layers of (rank, chunk) full recompute replays (0 without full recompute).

        recompute_num_layers counts per pipeline stage and is spread evenly over the rank's chunks,
        the first chunks taking the remainder; each chunk recomputes its first layers (Megatron block).
        """
        t = self.t
        n = len(self.stage_layers[rank][chunk])
        if t.recompute != "full":
            return 0
        if t.recompute_num_layers is None:
            return n
        share = t.recompute_num_layers // t.vpp + (1 if chunk < t.recompute_num_layers % t.vpp else 0)
        return min(n, share)

    @property
    def v_shape(self) -> bool:
        return self.t.schedule in V_SCHEDULES

    def virtual_stage(self, rank: int, chunk: int) -> int:
        pp = self.t.pp
        if self.v_shape:
            return rank if chunk == 0 else 2 * pp - 1 - rank
        return chunk * pp + rank

    def has_embedding(self, rank: int, chunk: int) -> bool:
        return self.virtual_stage(rank, chunk) == 0

    def has_output(self, rank: int, chunk: int) -> bool:
        return self.virtual_stage(rank, chunk) == self.t.pp * self.t.vpp - 1


def stage_layer_counts(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None,
                       split: str = "auto") -> list[int] | str:
    """Layers per virtual stage in virtual-stage order, or a reason string when impossible."""
    n_virtual = pp * vpp
    if first is None and last is None:
        even_ok = num_layers % n_virtual == 0
        # Megatron account_for_embedding/loss_in_pipeline_split: embedding and loss take a slot each
        el_ok = n_virtual > 1 and (num_layers + 2) % n_virtual == 0 and (num_layers + 2) // n_virtual > 1
        if split == "even" or (split == "auto" and even_ok):
            if not even_ok:
                return (f"num_layers={num_layers} is not divisible by pp*vpp = {pp}*{vpp} = {n_virtual} "
                        f"(pipeline_split=even)")
            return [num_layers // n_virtual] * n_virtual
        if not el_ok:
            return (f"num_layers={num_layers} is not divisible by pp*vpp = {pp}*{vpp} = {n_virtual}, nor is "
                    f"num_layers+2 = {num_layers + 2} (embedding and loss as stages); set "
                    f"first_stage_layers/last_stage_layers for an uneven split")
        per = (num_layers + 2) // n_virtual
        counts = [per] * n_virtual
        counts[0] -= 1
        counts[-1] -= 1
        return counts
    if pp == 1:
        return "first_stage_layers/last_stage_layers need pp > 1"
    rest = num_layers - (first or 0) - (last or 0)
    middle_ranks = pp - (first is not None) - (last is not None)
    per_rank: list[int | None] = [None] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    if middle_ranks == 0:
        if rest != 0:
            return (f"first_stage_layers + last_stage_layers = {(first or 0) + (last or 0)} must equal "
                    f"num_layers={num_layers} when pp=2")
    else:
        if rest <= 0 or rest % middle_ranks:
            return (f"the {rest} layers left after first/last stages do not split evenly over "
                    f"{middle_ranks} other pipeline ranks")
        per_rank = [c if c is not None else rest // middle_ranks for c in per_rank]
    counts_by_rank = [int(c) for c in per_rank]  # type: ignore[arg-type]
    for r, c in enumerate(counts_by_rank):
        if c <= 0 or c % vpp:
            return f"pipeline rank {r} would hold {c} layers, which does not split into vpp={vpp} chunks"
    out = [0] * n_virtual
    for r, c in enumerate(counts_by_rank):
        for ch in range(vpp):
            out[ch * pp + r] = c // vpp
    return out


def assign_layers(run: RunConfig) -> tuple[tuple[tuple[int, ...], ...], ...]:
    t, m = run.training, run.model
    first = t.first_stage_layers if t.first_stage_layers is not None else m.first_stage_layers
    last = t.last_stage_layers if t.last_stage_layers is not None else m.last_stage_layers
    counts = stage_layer_counts(m.num_layers, t.pp, t.vpp, first, last, t.pipeline_split)
    if isinstance(counts, str):
        raise ValueError(counts)
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    virtual = [tuple(range(starts[v], starts[v + 1])) for v in range(len(counts))]
    v_shape = t.schedule in V_SCHEDULES
    pp = t.pp
    stages = []
    for r in range(pp):
        chunks = []
        for ch in range(t.vpp):
            vs = (r if ch == 0 else 2 * pp - 1 - r) if v_shape else ch * pp + r
            chunks.append(virtual[vs])
        stages.append(tuple(chunks))
    return tuple(stages)
