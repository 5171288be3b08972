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
from typing import TYPE_CHECKING

from oracle.pipeline.schedules import get_schedule
from oracle.pipeline_layout import (PipelineAssignment, StageWeights, VirtualStage, assign, card_weights,
                                     pattern_positions)

if TYPE_CHECKING:  # annotations only: oracle.config checks legality through this module
    from oracle.config import RunConfig


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
    def assignment(self) -> PipelineAssignment:
        """What every virtual stage holds (decoder layers, embedding, MTP, loss); see
        :mod:`oracle.pipeline_layout` for the layout keys. Raises InvalidConfigError if they do not tile."""
        return assignment_of(self.run)

    @cached_property
    def stage_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """``stage_layers[rank][chunk]`` = decoder layer indices hosted there.

        Interleaved: virtual stage ``chunk * pp + rank``. V-shape schedules: rank r hosts virtual
        stages r and 2*pp-1-r.
        """
        return self.assignment.layers_by_rank(self.v_shape)

    def stage(self, rank: int, chunk: int) -> VirtualStage:
        """The virtual stage hosted by (rank, chunk)."""
        return self.assignment.by_rank(self.v_shape)[rank][chunk]

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
        m = self.run.model
        return min(n, share * m.positions_per_layer)  # Megatron layers: a hybrid_pairs card's are pairs

    @property
    def v_shape(self) -> bool:
        return get_schedule(self.t.schedule).layout == "v"

    def virtual_stage(self, rank: int, chunk: int) -> int:
        pp = self.t.pp
        if self.v_shape:
            return rank if chunk == 0 else 2 * pp - 1 - rank
        return chunk * pp + rank

    def has_embedding(self, rank: int, chunk: int) -> bool:
        return self.stage(rank, chunk).embedding

    def has_output(self, rank: int, chunk: int) -> bool:
        """Holds the final norm, output layer and loss."""
        return self.stage(rank, chunk).loss

    def mtp_modules(self, rank: int, chunk: int) -> int:
        """MTP modules hosted by (rank, chunk) (with the loss unless a layout string places them)."""
        return self.stage(rank, chunk).mtp


def placement_key(run: RunConfig) -> tuple:
    """Everything that decides what each (rank, chunk) of ``run`` holds: its decoder layers, embedding, loss
    and MTP modules (:func:`assignment_of` and the schedule's layout) and how many of its layers full
    recompute replays (:meth:`Layout.recomputed_layers`). Tables derived from these alone cache on it."""
    t = run.training
    return (run.model, t.pp, t.vpp, t.schedule, t.decoder_first_pipeline_num_layers, t.decoder_last_pipeline_num_layers,
            t.pipeline_model_parallel_layout, t.account_for_embedding_in_pipeline_split,
            t.account_for_loss_in_pipeline_split, t.recompute, t.recompute_num_layers, bf16_layers(run))


def bf16_layers(run: RunConfig) -> tuple[int, int]:
    """(first, last) decoder layers kept in BF16 under an FP8/FP4 recipe (``first_last_layers_bf16``); (0, 0) when
    none are."""
    t = run.training
    if not t.first_last_layers_bf16 or t.precision == "bf16":
        return 0, 0
    per = run.model.positions_per_layer  # Megatron layers: a hybrid_pairs card's are pairs
    return t.num_layers_at_start_in_bf16 * per, t.num_layers_at_end_in_bf16 * per


def assignment_of(run: RunConfig) -> PipelineAssignment:
    """The pipeline layer assignment of ``run`` from its layout keys (:func:`oracle.pipeline_layout.assign`)."""
    t, m = run.training, run.model
    # a hybrid_pairs card (a GPTModel written as (mixer, MLP) pattern pairs): the layout keys count its transformer
    # layers, as Megatron's do; each becomes its two pattern positions
    name = m.name if m.pipeline_layers == m.num_layers else f"{m.name} (counted in its {m.pipeline_layers} " \
                                                            f"transformer layers)"
    a = assign(m.pipeline_layers, t.pp, t.vpp, mtp_layers=m.mtp_layers, first=t.decoder_first_pipeline_num_layers,
               last=t.decoder_last_pipeline_num_layers, layout=t.pipeline_model_parallel_layout,
               account_for_embedding=t.account_for_embedding_in_pipeline_split,
               account_for_loss=t.account_for_loss_in_pipeline_split, model=name, weights=lambda: _weights(m))
    per = m.positions_per_layer
    return a if per == 1 else pattern_positions(a, per)


@lru_cache(maxsize=256)
def _weights(card) -> StageWeights:
    return card_weights(card)
