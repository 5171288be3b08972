"""Data types of the pipeline simulator: ops, per-stage costs, results, and the stage mapping.

Vocabulary (one for the whole package):
- ``pp`` pipeline ranks, ``vpp`` model chunks per rank, ``V = pp * vpp`` virtual stages.
- A *virtual stage* ``v`` is one contiguous slice of the model in forward order; stage 0 holds the
  embedding, stage ``V - 1`` the output layer and loss.
- An op is ``F`` (forward), ``B`` (input-gradient backward), ``W`` (weight-gradient backward) or
  ``BW`` (the fused backward B+W of schedules that do not split it), of one micro-batch ``mb`` on one
  local ``chunk`` of a rank.
- Times are seconds, memory bytes (SI inside, see STYLE.md "Units and names").
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from oracle.errors import InvalidConfigError, PrimusError

Layout = Literal["interleaved", "v"]
OpKind = Literal["F", "B", "W", "BW"]
LAYOUTS: tuple[str, ...] = ("interleaved", "v")
OP_KINDS: tuple[str, ...] = ("F", "B", "W", "BW")


class ScheduleDeadlockError(PrimusError, ValueError):
    """An op order can never complete: some rank waits on an op that cannot run first."""


def virtual_stage(layout: Layout, pp: int, vpp: int, rank: int, chunk: int) -> int:
    """Virtual stage hosted by ``rank``'s local ``chunk``.

    - ``interleaved`` (Megatron): ``chunk * pp + rank``, so rank r hosts r, r+pp, r+2pp, ...
    - ``v`` (ZB-V / V-shape family, vpp must be 2): chunk 0 is stage ``rank`` and chunk 1 is stage
      ``2*pp - 1 - rank``, so the first AND the last virtual stage live on rank 0 (the embedding and
      the loss share a device; AMD's code used the interleaved map here, which is wrong).
    """
    if not 0 <= rank < pp or not 0 <= chunk < vpp:
        raise InvalidConfigError(f"rank={rank}, chunk={chunk} out of range for pp={pp}, vpp={vpp}")
    if layout == "interleaved":
        return chunk * pp + rank
    if layout == "v":
        if vpp != 2:
            raise InvalidConfigError(f"the 'v' layout needs vpp=2 (two chunks per rank), got vpp={vpp}")
        return rank if chunk == 0 else 2 * pp - 1 - rank
    raise InvalidConfigError(f"layout={layout!r} is not one of {' | '.join(LAYOUTS)}")


def stage_map(layout: Layout, pp: int, vpp: int) -> tuple[tuple[int, int], ...]:
    """``stage_map(...)[v] = (rank, chunk)`` for every virtual stage ``v`` (inverse of virtual_stage)."""
    out: list[tuple[int, int] | None] = [None] * (pp * vpp)
    for r in range(pp):
        for c in range(vpp):
            out[virtual_stage(layout, pp, vpp, r, c)] = (r, c)
    assert all(x is not None for x in out), "virtual_stage is not a bijection"
    return tuple(out)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Op:
    """One unit of pipeline work on one rank (positional: ``Op('F', mb, chunk)``)."""

    kind: OpKind
    """``F`` forward, ``B`` input-gradient backward, ``W`` weight-gradient backward, ``BW`` fused B+W."""
    mb: int
    """Micro-batch index, 0-based."""
    chunk: int = 0
    """Local model chunk on the rank (0..vpp-1); the layout turns it into a virtual stage."""

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}.{self.chunk}"


def _matrix(value: Any, name: str, problems: list[str]) -> tuple[tuple[float, ...], ...]:
    try:
        rows = tuple(tuple(float(x) for x in row) for row in value)
    except TypeError:
        problems.append(f"{name} must be a [rank][chunk] nested sequence of numbers, got {value!r}")
        return ()
    for r, row in enumerate(rows):
        for c, x in enumerate(row):
            if not math.isfinite(x) or x < 0:
                problems.append(f"{name}[{r}][{c}] = {x} must be finite and >= 0")
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Per-rank, per-chunk op costs and activation sizes; hashable, so builds can be cached on it.

    The rank x chunk shape of every matrix must agree. A schedule that does not split the backward
    runs a fused ``BW`` op costing ``b_s + w_s``.
    """

    f_s: tuple[tuple[float, ...], ...]
    """``f_s[r][c]``: forward time of one micro-batch through rank r's chunk c."""
    b_s: tuple[tuple[float, ...], ...]
    """``b_s[r][c]``: input-gradient (activation-gradient) backward time."""
    w_s: tuple[tuple[float, ...], ...]
    """``w_s[r][c]``: weight-gradient backward time (0 when unknown: then B carries the whole backward)."""
    act_bytes: tuple[tuple[float, ...], ...]
    """``act_bytes[r][c]``: activation bytes one micro-batch leaves alive after the F of that chunk."""
    p2p_s: float | tuple[float, ...] = 0.0
    """Time to send one activation (or its gradient) across a boundary: a scalar for every boundary, or
    ``pp*vpp - 1`` values where ``p2p_s[v]`` is the boundary v -> v+1 in virtual-stage order (intra- vs
    inter-node links differ). A boundary between two chunks of the same rank (the V turn) costs 0."""
    p2p_blocking: bool = False
    """How a send behaves. False: asynchronous, the transfer sits only on the dependency edge (Megatron's
    interleaved schedule with overlap_p2p_comm). True: the sending op holds its rank's stream for the
    transfer and the consumer sees the data at that op's end (Megatron's non-interleaved 1F1B waits on
    its send/recv requests before the next op)."""
    b_release_fraction: float = 0.5
    """Share of a chunk's activations freed by B in split schedules (the rest is freed by W). The
    input-gradient step drops most saved tensors (attention scores, norms, activations of the
    nonlinearities) while W still needs the GEMM inputs; 0.5 is a neutral default, and the memory
    bounds of the V schedules are met for any value."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        mats = {}
        for name in ("f_s", "b_s", "w_s", "act_bytes"):
            mats[name] = _matrix(getattr(self, name), name, problems)
            object.__setattr__(self, name, mats[name])
        shape = tuple(len(row) for row in mats["f_s"])
        if not shape or 0 in shape or len(set(shape)) != 1:
            problems.append(f"f_s must have pp >= 1 rows of the same vpp >= 1 length, got row lengths {shape}")
        for name in ("b_s", "w_s", "act_bytes"):
            other = tuple(len(row) for row in mats[name])
            if other != shape:
                problems.append(f"{name} has row lengths {other}, f_s has {shape}; they must match")
        p2p = self.p2p_s
        if isinstance(p2p, (int, float)):
            p2p = float(p2p)
            if not math.isfinite(p2p) or p2p < 0:
                problems.append(f"p2p_s = {p2p} must be finite and >= 0")
        else:
            p2p = tuple(float(x) for x in p2p)
            n_bound = len(shape) * (shape[0] if shape else 0) - 1
            if len(p2p) != n_bound:
                problems.append(f"p2p_s has {len(p2p)} values; pp*vpp - 1 = {n_bound} boundaries need one each")
            bad = [x for x in p2p if not math.isfinite(x) or x < 0]
            if bad:
                problems.append(f"p2p_s values must be finite and >= 0, got {bad}")
        object.__setattr__(self, "p2p_s", p2p)
        frac = float(self.b_release_fraction)
        if not 0.0 <= frac <= 1.0:
            problems.append(f"b_release_fraction = {frac} must be in [0, 1]")
        object.__setattr__(self, "b_release_fraction", frac)
        if problems:
            raise InvalidConfigError(problems)

    @classmethod
    def trusted(cls, *, f_s: tuple[tuple[float, ...], ...], b_s: tuple[tuple[float, ...], ...],
                w_s: tuple[tuple[float, ...], ...], act_bytes: tuple[tuple[float, ...], ...],
                p2p_s: float | tuple[float, ...] = 0.0, p2p_blocking: bool = False,
                b_release_fraction: float = 0.5) -> "StageCosts":
        """Costs the oracle itself computed (tuples of finite non-negative floats of one shape, ``p2p_s`` a
        float or a tuple of floats): built without the checks and conversions of the public constructor,
        which a projection would otherwise pay on every call. Anything from outside goes through ``StageCosts(...)``."""
        obj = object.__new__(cls)
        for name, value in (("f_s", f_s), ("b_s", b_s), ("w_s", w_s), ("act_bytes", act_bytes), ("p2p_s", p2p_s),
                            ("p2p_blocking", p2p_blocking), ("b_release_fraction", b_release_fraction)):
            object.__setattr__(obj, name, value)
        return obj

    @property
    def pp(self) -> int:
        return len(self.f_s)

    @property
    def vpp(self) -> int:
        return len(self.f_s[0])

    def boundary_p2p_s(self) -> tuple[float, ...]:
        """``pp*vpp - 1`` per-boundary send times (before zeroing same-rank boundaries)."""
        if isinstance(self.p2p_s, float):
            return (self.p2p_s,) * (self.pp * self.vpp - 1)
        return self.p2p_s

    def send_s(self, layout: Layout) -> tuple[tuple[tuple[float, float], ...], ...]:
        """``send_s(layout)[r][c] = (F send, B send)``: the wire time of the output of rank r's chunk c
        (activation forward to the next stage, gradient backward to the previous one); 0 at the ends
        of the pipeline and across a boundary between two chunks of the same rank (the V turn)."""
        smap = stage_map(layout, self.pp, self.vpp)
        lat = self.boundary_p2p_s()
        n = len(smap)
        out = [[(0.0, 0.0)] * self.vpp for _ in range(self.pp)]
        for v, (r, c) in enumerate(smap):
            fs = lat[v] if v + 1 < n and smap[v + 1][0] != r else 0.0
            bs = lat[v - 1] if v > 0 and smap[v - 1][0] != r else 0.0
            out[r][c] = (fs, bs)
        return tuple(tuple(row) for row in out)

    @classmethod
    def uniform(cls, *, pp: int, vpp: int = 1, f_s: float, b_s: float, w_s: float = 0.0,
                act_bytes: float = 1.0, p2p_s: float = 0.0, b_release_fraction: float = 0.5,
                p2p_blocking: bool = False) -> "StageCosts":
        """Every rank and chunk costs the same (the textbook setting of the closed forms)."""
        def mat(x: float) -> tuple[tuple[float, ...], ...]:
            return tuple((float(x),) * vpp for _ in range(pp))
        return cls(f_s=mat(f_s), b_s=mat(b_s), w_s=mat(w_s), act_bytes=mat(act_bytes), p2p_s=p2p_s,
                   b_release_fraction=b_release_fraction, p2p_blocking=p2p_blocking)

    @classmethod
    def from_virtual_stages(cls, *, layout: Layout, pp: int, vpp: int, f_s: Sequence[float],
                            b_s: Sequence[float], w_s: Sequence[float], act_bytes: Sequence[float],
                            p2p_s: float | Sequence[float] = 0.0, b_release_fraction: float = 0.5,
                            p2p_blocking: bool = False) -> "StageCosts":
        """Costs given per virtual stage (forward order), placed on ranks/chunks by ``layout``.

        This is the safe way to build V-shape costs: the output layer (last stage) lands on rank 0.
        """
        n = pp * vpp
        for name, seq in (("f_s", f_s), ("b_s", b_s), ("w_s", w_s), ("act_bytes", act_bytes)):
            if len(seq) != n:
                raise InvalidConfigError(f"{name} has {len(seq)} values; pp*vpp = {pp}*{vpp} = {n} stages "
                                         f"need one each")
        smap = stage_map(layout, pp, vpp)

        def mat(seq: Sequence[float]) -> tuple[tuple[float, ...], ...]:
            m = [[0.0] * vpp for _ in range(pp)]
            for v, (r, c) in enumerate(smap):
                m[r][c] = float(seq[v])
            return tuple(tuple(row) for row in m)
        p2p = p2p_s if isinstance(p2p_s, (int, float)) else tuple(p2p_s)
        return cls(f_s=mat(f_s), b_s=mat(b_s), w_s=mat(w_s), act_bytes=mat(act_bytes), p2p_s=p2p,
                   b_release_fraction=b_release_fraction, p2p_blocking=p2p_blocking)


class TimelineEntry(NamedTuple):
    """One executed op, for Gantt charts and debugging."""

    rank: int
    op: Op
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineResult:
    """What one simulated schedule did; per-rank tuples are indexed by pipeline rank."""

    schedule: str
    """Registered schedule name (or ``custom`` for a hand-made order)."""
    pp: int
    """Pipeline ranks."""
    vpp: int
    """Model chunks per rank."""
    layout: Layout
    """Virtual-stage mapping used (``interleaved`` or ``v``)."""
    num_microbatches: int
    """Micro-batches per iteration."""
    makespan_s: float
    """Time from the first op's start to the last op's end (the pipeline part of one iteration)."""
    busy_s: tuple[float, ...]
    """Compute time per rank (sum of its op costs)."""
    bubble_s: tuple[float, ...]
    """Idle time per rank: ``makespan_s - busy_s[r]``."""
    peak_activation_bytes: tuple[float, ...]
    """Peak saved-activation bytes per rank (sampled after every F; B and W only free memory)."""
    peak_in_flight: tuple[int, ...]
    """Peak number of micro-batch-chunks alive per rank (F done, not yet fully released by W/BW)."""
    order: tuple[tuple[Op, ...], ...]
    """The executed op order per rank."""
    start_s: tuple[tuple[float, ...], ...]
    """Start time of ``order[r][i]``."""
    end_s: tuple[tuple[float, ...], ...]
    """End time of ``order[r][i]``."""
    approximate: bool = False
    """True when the schedule is a heuristic stand-in for the published one or an optimum was not proven."""
    note: str = ""
    """Why it is approximate, what it assumed, or how the solver ended."""

    @property
    def timeline(self) -> list[TimelineEntry]:
        """Every executed op as (rank, op, start_s, end_s), rank by rank in execution order."""
        return [TimelineEntry(r, op, s, e)
                for r, (ops, st, en) in enumerate(zip(self.order, self.start_s, self.end_s))
                for op, s, e in zip(ops, st, en)]

    @property
    def bubble_fraction(self) -> float:
        """Mean idle share of the makespan over ranks (what a Gantt chart shows as white space)."""
        if self.makespan_s <= 0:
            return 0.0
        return sum(self.bubble_s) / (len(self.bubble_s) * self.makespan_s)

    @property
    def bubble_ratio(self) -> float:
        """Bubble relative to the ideal compute of the busiest rank: ``makespan / max(busy) - 1``.

        For uniform stages this is the textbook ratio, e.g. (p-1)/m for 1F1B (see closed_form_bubble).
        """
        busy = max(self.busy_s)
        return self.makespan_s / busy - 1.0 if busy > 0 else 0.0

    @property
    def max_peak_activation_bytes(self) -> float:
        """Worst rank's peak activation bytes (what decides whether the pipeline fits)."""
        return max(self.peak_activation_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Summary without the timeline (JSON-friendly)."""
        return {"schedule": self.schedule, "pp": self.pp, "vpp": self.vpp, "layout": self.layout,
                "num_microbatches": self.num_microbatches, "makespan_s": self.makespan_s,
                "bubble_fraction": self.bubble_fraction, "bubble_ratio": self.bubble_ratio,
                "busy_s": list(self.busy_s), "bubble_s": list(self.bubble_s),
                "peak_activation_bytes": list(self.peak_activation_bytes),
                "peak_in_flight": list(self.peak_in_flight),
                "approximate": self.approximate, "note": self.note}
