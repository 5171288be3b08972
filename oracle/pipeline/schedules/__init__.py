"""Schedule registry: each schedule is one module that builds per-rank op lists.

A builder is ``build(pp, vpp, num_microbatches) -> list[list[Op]]`` (cost-aware builders also take
``costs=``) registered with :func:`register`, which records its layout, whether it splits the
backward into B and W, the chunk counts it accepts (VPP rule, least micro-batches), its in-flight
micro-batch formula (the memory model's) and whether it is an approximation. Everything else (the
config's valid names, legality, memory, the search space, the CLI) reads these specs, so adding a
schedule = adding one module to this package: every public module here is imported on load.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.pipeline import _jit
from oracle.pipeline.types import Layout, Op, StageCosts

VppRule = Literal["one", "two", "at_least_two"]
Order = list[list[Op]]
InFlight = Callable[[int, int, int, int], float]
"""``in_flight(pp, vpp, num_microbatches, rank)``: micro-batches whose activations are alive on ``rank``
at its peak, in units of the rank's full per-micro-batch activation (all its chunks)."""


@dataclass(frozen=True, slots=True)
class Built:
    """A built order plus what the builder knows about its quality."""

    order: Order | list[np.ndarray]
    """Per-rank op lists, or (from ``build_array``) per-rank arrays of (kind code, mb, chunk) rows."""
    approximate: bool
    note: str


def native_order(builder: str, pp: int, num_microbatches: int, rows_per_microbatch: int) -> Built | None:
    """The order the C extension's ``builder`` (``zbv_order``, ``zb_h1_order``) writes, every rank's
    ``rows_per_microbatch`` x m rows of (kind code, mb, chunk) one after another, split per rank; None where the
    extension does not run (``_jit.kernels``: the schedule's numpy builder then makes the same rows)."""
    ext = _jit.kernels()
    if ext is None:
        return None
    out = np.empty((pp * rows_per_microbatch * num_microbatches, 3), dtype=np.int64)
    getattr(ext, builder)(pp, num_microbatches, out)
    return Built(np.split(out, pp), False, "")


def is_arrays(order: Order | list[np.ndarray]) -> bool:
    """``order`` is in array form (per-rank arrays of kind code, mb, chunk rows), not op lists."""
    return bool(order) and isinstance(order[0], np.ndarray)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A registered schedule."""

    name: str
    """Registry key (the ``pp_schedule`` value of a TrainingConfig)."""
    build: Callable[..., Order]
    """``build(pp, vpp, num_microbatches[, costs=...]) -> list[list[Op]]``."""
    in_flight: InFlight
    """Closed-form in-flight micro-batches per rank (see :data:`InFlight`); the memory model's input."""
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
    searched_by_default: bool = False
    """In a search space's default schedule list (the paper's Sec. 2 set); others only when restricted in."""
    position: int = 100
    """Listing order (1f1b first: comparisons use it as the baseline); ties by name."""
    build_array: Callable[[int, int, int], Built] | None = None
    """Optional vectorised builder of a fixed order: ``build_array(pp, vpp, num_microbatches)`` gives the
    same order as ``build`` as per-rank arrays (see ``oracle.pipeline.fast_compile``); the plan cache
    uses it, tests check it against ``build``."""

    def accepts_vpp(self, vpp: int) -> bool:
        """The VPP rule: ``one`` -> vpp == 1, ``two`` -> vpp == 2, ``at_least_two`` -> vpp >= 2."""
        return {"one": vpp == 1, "two": vpp == 2, "at_least_two": vpp >= 2}[self.vpp_rule]

    def vpp_choices(self, candidates: Iterable[int]) -> list[int]:
        """The values of ``candidates`` this schedule accepts, sorted."""
        return sorted({v for v in candidates if self.accepts_vpp(v)})

    def in_flight_microbatches(self, pp: int, vpp: int, num_microbatches: int, rank: int) -> float:
        """See :data:`InFlight`."""
        return float(self.in_flight(pp, vpp, num_microbatches, rank))

    def embedding_in_flight(self, pp: int, vpp: int, num_microbatches: int) -> float:
        """Micro-batches of the first virtual stage (embedding) alive on rank 0 at its peak."""
        m = num_microbatches
        f0 = self.in_flight_microbatches(pp, vpp, m, 0)
        if self.layout == "v":
            return float(max(1.0, min(2 * f0 - 1, m)))  # all in-flight chunks but the last stage's one
        if vpp > 1:
            n = round(f0 * vpp)  # chunks in flight; Megatron runs chunk 0 for pp micro-batches, then chunk 1, ...
            return float(min(n // (pp * vpp) * pp + min(n % (pp * vpp), pp), m))
        return f0

    def problems(self, pp: int, vpp: int, num_microbatches: int | None = None) -> list[str]:
        """Why (pp, vpp, num_microbatches) cannot run this schedule; empty when it can."""
        out = []
        if pp < 1:
            out.append(f"pp={pp} must be >= 1")
        def others() -> str:  # only for the message (a legal layout asks this on every run)
            return ", ".join(n for n, s in SCHEDULES.items() if s.accepts_vpp(vpp)) or "none"
        if self.vpp_rule == "one" and vpp != 1:
            out.append(f"schedule {self.name} runs one chunk per rank and needs vpp=1, got vpp={vpp}; "
                       f"schedules for vpp={vpp}: {others()}")
        elif self.vpp_rule == "two" and vpp != 2:
            out.append(f"schedule {self.name} is a V-shape schedule and needs vpp=2 (two chunks per rank), "
                       f"got vpp={vpp}; schedules for vpp={vpp}: {others()}")
        elif self.vpp_rule == "at_least_two" and vpp < 2:
            out.append(f"schedule {self.name} needs vpp >= 2 chunks per rank, got vpp={vpp}; "
                       f"schedules for vpp={vpp}: {others()}")
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
        """Check the sizes and build (cost-aware builders get ``costs``); the order as per-rank op lists."""
        built = self._make(pp, vpp, num_microbatches, costs)
        if is_arrays(built.order):
            from oracle.pipeline.fast_compile import array_to_ops
            return Built([list(array_to_ops(a, vpp)) for a in built.order], built.approximate, built.note)
        return built

    def _make(self, pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Built:
        """:meth:`make`, the order as the builder gave it (a ``build_detailed`` may give arrays)."""
        self.check(pp, vpp, num_microbatches)
        if self.build_detailed is not None:
            return self.build_detailed(pp, vpp, num_microbatches, costs=costs)
        if self.cost_aware:
            order = self.build(pp, vpp, num_microbatches, costs=costs)
        else:
            order = self.build(pp, vpp, num_microbatches)
        return Built(order, self.approximate, self.summary if self.approximate else "")

    @property
    def builds_arrays(self) -> bool:
        """:meth:`make_fast` returns the order in array form."""
        return self.build_array is not None and not self.cost_aware

    def make_fast(self, pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Built:
        """:meth:`make`, in array form when the schedule has a ``build_array`` (or its ``build_detailed`` gave
        arrays: :func:`is_arrays`)."""
        if not self.builds_arrays:
            return self._make(pp, vpp, num_microbatches, costs)
        self.check(pp, vpp, num_microbatches)
        return self.build_array(pp, vpp, num_microbatches)


SCHEDULES: dict[str, ScheduleSpec] = {}


def register(name: str, *, layout: Layout, splits_bw: bool, vpp_rule: VppRule, in_flight: InFlight,
             cost_aware: bool = False, approximate: bool = False, summary: str = "",
             build_detailed: Callable[..., Built] | None = None,
             min_microbatches: Callable[[int, int], int] | None = None, blocking_p2p: bool = False,
             searched_by_default: bool = False, position: int = 100,
             build_array: Callable[[int, int, int], Built] | None = None) -> Callable[[Callable[..., Order]], Callable[..., Order]]:
    """Decorator registering a builder under ``name``; a duplicate name (or 'auto') raises ValueError."""
    def deco(fn: Callable[..., Order]) -> Callable[..., Order]:
        if name == "auto":
            raise ValueError("'auto' is reserved: TrainingConfig.pp_schedule uses it for 1f1b/interleaved by vpp")
        if name in SCHEDULES:
            raise ValueError(f"pipeline schedule {name!r} is already registered")
        SCHEDULES[name] = ScheduleSpec(name=name, build=fn, layout=layout, splits_bw=splits_bw, vpp_rule=vpp_rule,
                                       in_flight=in_flight, cost_aware=cost_aware, approximate=approximate,
                                       summary=summary, build_detailed=build_detailed,
                                       min_microbatches=min_microbatches, blocking_p2p=blocking_p2p,
                                       searched_by_default=searched_by_default, position=position,
                                       build_array=build_array)
        return fn
    return deco


def unregister(name: str) -> None:
    """Remove a registered schedule (tests that register a toy one)."""
    SCHEDULES.pop(name, None)


def schedule_names() -> tuple[str, ...]:
    """Registered schedule names in listing order (not 'auto')."""
    return tuple(SCHEDULES)


def get_schedule(name: str) -> ScheduleSpec:
    """The registered schedule ``name``; UnknownComponentError lists the valid names."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise UnknownComponentError("pipeline schedule", name, SCHEDULES) from None


def _load_bundled_schedules() -> None:
    """Import every public module of this package (each registers its schedule), then list them by
    ``position``. The deliberate lazy registry load of tests/test_import_graph.py."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    ordered = sorted(SCHEDULES.values(), key=lambda s: (s.position, s.name))
    SCHEDULES.clear()
    SCHEDULES.update((s.name, s) for s in ordered)


_load_bundled_schedules()
