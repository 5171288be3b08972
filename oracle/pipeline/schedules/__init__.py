"""Schedule registry: each schedule is one module that builds per-rank op lists.

A builder is ``build(pp, vpp, num_microbatches) -> list[list[Op]]`` (cost-aware builders also take
``costs=``) registered with :func:`register`, which records its layout, whether it splits the
backward into B and W, the chunk counts it accepts and whether it is an approximation. Adding a
schedule = adding a module here and importing it at the bottom of this file.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.pipeline.types import Layout, Op, StageCosts

VppRule = Literal["one", "two", "at_least_two"]
Order = list[list[Op]]


@dataclass(frozen=True, slots=True)
class Built:
    """A built order plus what the builder knows about its quality."""

    order: Order
    approximate: bool
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A registered schedule."""

    name: str
    """Registry key (the ``pp_schedule`` value of a TrainingConfig)."""
    build: Callable[..., Order]
    """``build(pp, vpp, num_microbatches[, costs=...]) -> list[list[Op]]``."""
    layout: Layout
    """Virtual-stage mapping the op lists assume."""
    splits_bw: bool
    """True when the backward runs as separate B and W ops."""
    vpp_rule: VppRule
    """``one`` (vpp must be 1), ``two`` (exactly 2, V shapes) or ``at_least_two`` (interleaved)."""
    cost_aware: bool = False
    """The builder looks at the costs (greedy or solver); results are cached per costs."""
    approximate: bool = False
    """The construction is a heuristic stand-in for the published schedule."""
    summary: str = ""
    """One line for listings and docs."""
    build_detailed: Callable[..., Built] | None = None
    """Optional builder that also reports approximate/note per build (the ILP's solver status)."""
    min_microbatches: Callable[[int, int], int] | None = None
    """Smallest accepted num_microbatches as a function of (pp, vpp); None = 1."""
    blocking_p2p: bool = False
    """The runtime waits on each send/recv before its next op, so a transfer holds the rank
    (StageCosts.p2p_blocking); False: sends overlap compute and only delay the consumer."""

    def problems(self, pp: int, vpp: int, num_microbatches: int | None = None) -> list[str]:
        """Why (pp, vpp, num_microbatches) cannot run this schedule; empty when it can."""
        out = []
        if pp < 1:
            out.append(f"pp={pp} must be >= 1")
        if self.vpp_rule == "one" and vpp != 1:
            out.append(f"schedule {self.name} runs one chunk per rank and needs vpp=1, got vpp={vpp}")
        elif self.vpp_rule == "two" and vpp != 2:
            out.append(f"schedule {self.name} is a V-shape schedule and needs vpp=2 (two chunks per rank), "
                       f"got vpp={vpp}")
        elif self.vpp_rule == "at_least_two" and vpp < 2:
            out.append(f"schedule {self.name} needs vpp >= 2 chunks per rank, got vpp={vpp}; use 1f1b for vpp=1")
        if num_microbatches is not None:
            least = self.min_microbatches(pp, vpp) if self.min_microbatches else 1
            if num_microbatches < least:
                out.append(f"schedule {self.name} needs num_microbatches >= {least} for pp={pp}, vpp={vpp}, "
                           f"got {num_microbatches}")
        return out

    def check(self, pp: int, vpp: int, num_microbatches: int) -> None:
        problems = self.problems(pp, vpp, num_microbatches)
        if problems:
            raise InvalidConfigError(problems)

    def make(self, pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Built:
        """Check the sizes and build (cost-aware builders get ``costs``)."""
        self.check(pp, vpp, num_microbatches)
        if self.build_detailed is not None:
            return self.build_detailed(pp, vpp, num_microbatches, costs=costs)
        if self.cost_aware:
            order = self.build(pp, vpp, num_microbatches, costs=costs)
        else:
            order = self.build(pp, vpp, num_microbatches)
        return Built(order, self.approximate, self.summary if self.approximate else "")


SCHEDULES: dict[str, ScheduleSpec] = {}


def register(name: str, *, layout: Layout, splits_bw: bool, vpp_rule: VppRule, cost_aware: bool = False,
             approximate: bool = False, summary: str = "", build_detailed: Callable[..., Built] | None = None,
             min_microbatches: Callable[[int, int], int] | None = None, blocking_p2p: bool = False
             ) -> Callable[[Callable[..., Order]], Callable[..., Order]]:
    """Decorator registering a builder under ``name``; a duplicate name raises ValueError."""
    def deco(fn: Callable[..., Order]) -> Callable[..., Order]:
        if name in SCHEDULES:
            raise ValueError(f"pipeline schedule {name!r} is already registered")
        SCHEDULES[name] = ScheduleSpec(name=name, build=fn, layout=layout, splits_bw=splits_bw, vpp_rule=vpp_rule,
                                       cost_aware=cost_aware, approximate=approximate, summary=summary,
                                       build_detailed=build_detailed, min_microbatches=min_microbatches,
                                       blocking_p2p=blocking_p2p)
        return fn
    return deco


def get_schedule(name: str) -> ScheduleSpec:
    """The registered schedule ``name``; UnknownComponentError lists the valid names."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise UnknownComponentError("pipeline schedule", name, SCHEDULES) from None


# Registration happens on import; keep this list explicit (STYLE.md: registries are explicit).
from oracle.pipeline.schedules import one_f_one_b, interleaved, zero_bubble, ilp  # noqa: E402,F401,I001
from oracle.pipeline.schedules import zbv, zbv_greedy, v_half, v_min  # noqa: E402,F401
