"""Other load on this machine while something is measured (no torch).

Timings taken while other processes run are not this machine's: on a 2-core host one other busy process
(even at nice 19) slowed the two-process end-to-end runs far more than their benchmark (docs/benchmark.md).
The check is CPU accounting, not a guess from timings: over an interval, the CPU time the kernel accounts to
every process on the watched CPUs (``/proc/stat``: user, nice, system, irq, softirq, plus the hypervisor's
steal) less this process tree's own (``getrusage`` of this process and its reaped children) is what others
used, in cores' worth (CPU seconds / wall seconds). Load averages lag by a minute and count our own work; this
does neither. A measurement that needs fewer cores than the machine has tolerates others on the rest. Where ``/proc/stat`` cannot be read (not Linux) nothing is known and nothing is flagged.
"""
from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BUSY_LIMIT_CORES = 0.15
"""Others' CPU use (cores' worth, averaged over an interval) above which a measurement counts as taken under
load. An idle 2-core VM of this project shows 0.00-0.05 (kernel threads, shells); one other busy process is
~1.0, and even a short compile or test run averages several tenths over a 10 s run."""
QUIET_WINDOW_S = 3.0
"""Length of one idle-machine sample while waiting for quiet."""
_now = time.monotonic


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuSample:
    """Cumulative CPU accounting at one moment."""

    wall_s: float
    busy_s: float
    """CPU seconds every process used on the watched CPUs since boot (user+nice+system+irq+softirq)."""
    steal_s: float
    """CPU seconds the hypervisor gave the watched CPUs' time to other guests."""
    own_s: float
    """CPU seconds of this process and its reaped children (user+system)."""
    cpus: int
    """CPUs watched."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSeen:
    """What others did on the watched CPUs over one interval."""

    wall_s: float
    other_cores: float
    """Cores' worth of CPU other processes used (busy less our own, plus steal), averaged over the interval."""
    own_cores: float
    """Cores' worth this process tree used."""
    steal_cores: float
    """Of other_cores: the hypervisor's steal."""
    cpus: int
    limit_cores: float = BUSY_LIMIT_CORES
    need_cores: int | None = None
    """Cores the measurement uses (None: all watched); others may use the rest freely."""

    @property
    def allowed_cores(self) -> float:
        """Others' use tolerated: the limit, plus the cores the measurement leaves free."""
        need = self.cpus if self.need_cores is None else self.need_cores
        return self.limit_cores + max(0, self.cpus - need)

    @property
    def busy(self) -> bool:
        return self.other_cores > self.allowed_cores

    def text(self) -> str:
        steal = f", steal {self.steal_cores:.2f}" if self.steal_cores >= 0.005 else ""
        return (f"others used {self.other_cores:.2f} of {self.cpus} core(s){steal} over {self.wall_s:.1f} s "
                f"(limit {self.allowed_cores:.2f})")

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {"wall_s": self.wall_s, "other_cores": self.other_cores, "own_cores": self.own_cores,
                "steal_cores": self.steal_cores, "cpus": self.cpus, "limit_cores": self.allowed_cores,
                "busy": self.busy}


def _watched(cpus: Sequence[int] | None) -> set[int]:
    if cpus is not None:
        return set(cpus)
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def sample(cpus: Sequence[int] | None = None, *, stat_path: str = "/proc/stat") -> CpuSample | None:
    """CPU accounting now over ``cpus`` (default: those this process may run on); None without /proc/stat."""
    watch = _watched(cpus)
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = steal = 0
    seen = 0
    try:
        with open(stat_path) as fh:
            for line in fh:
                name, *vals = line.split()
                if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in watch:
                    continue
                v = [int(x) for x in vals] + [0] * 8
                busy += v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq (guest is inside user)
                steal += v[7]
                seen += 1
    except (OSError, ValueError):
        return None
    if not seen:
        return None
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return CpuSample(wall_s=time.monotonic(), busy_s=busy / tick, steal_s=steal / tick, own_s=own, cpus=seen)


def load_between(a: CpuSample | None, b: CpuSample | None, *, limit_cores: float = BUSY_LIMIT_CORES,
                 need_cores: int | None = None) -> LoadSeen | None:
    """Others' load between two samples (None when either is unknown or no time passed)."""
    if a is None or b is None or b.wall_s <= a.wall_s:
        return None
    wall = b.wall_s - a.wall_s
    own = max(0.0, b.own_s - a.own_s)
    steal = max(0.0, b.steal_s - a.steal_s)
    other = max(0.0, b.busy_s - a.busy_s - own) + steal
    return LoadSeen(wall_s=wall, other_cores=other / wall, own_cores=own / wall, steal_cores=steal / wall,
                    cpus=b.cpus, limit_cores=limit_cores, need_cores=need_cores)


class LoadMonitor:
    """Others' load around measurements (``measure``) and while this process sleeps (``wait_for_quiet``)."""

    def __init__(self, *, limit_cores: float = BUSY_LIMIT_CORES, cpus: Sequence[int] | None = None,
                 need_cores: int | None = None) -> None:
        """``need_cores``: cores the measurements use (default all watched): on a machine with more, others may
        use the rest without counting as load."""
        self.limit_cores, self.need_cores = limit_cores, need_cores
        self.cpus = sorted(_watched(cpus))
        """Fixed at creation: a process pinned to one core later (a one-core benchmark) still watches them all."""
        self.seen: list[LoadSeen] = []

    def mark(self) -> CpuSample | None:
        """The start of an interval (``since``)."""
        return sample(self.cpus)

    def since(self, mark: CpuSample | None) -> LoadSeen | None:
        """Others' load from ``mark`` to now, recorded in ``seen``."""
        seen = load_between(mark, sample(self.cpus), limit_cores=self.limit_cores, need_cores=self.need_cores)
        if seen is not None:
            self.seen.append(seen)
        return seen

    def measure(self, fn: Callable[[], object]) -> tuple[object, LoadSeen | None]:
        """Run ``fn`` and return (its result, others' load while it ran)."""
        a = self.mark()
        out = fn()
        return out, self.since(a)

    def idle(self, window_s: float = QUIET_WINDOW_S) -> LoadSeen | None:
        """Others' load over ``window_s`` of this process sleeping."""
        a = sample(self.cpus)
        time.sleep(window_s)
        return load_between(a, sample(self.cpus), limit_cores=self.limit_cores, need_cores=self.need_cores)

    def wait_for_quiet(self, wait_s: float, *, log: Callable[..., None] = print,
                       window_s: float = QUIET_WINDOW_S) -> tuple[LoadSeen | None, float]:
        """Sample idle windows until one is quiet or ``wait_s`` has passed: (the last window, seconds waited).
        The last window is busy when the machine never went quiet."""
        t0 = _now()
        seen = self.idle(window_s)
        while seen is not None and seen.busy and _now() - t0 + window_s <= wait_s:
            log(f"  machine busy: {seen.text()}; waiting for quiet "
                f"({_now() - t0:.0f}/{wait_s:.0f} s) ...")
            seen = self.idle(window_s)
        return seen, _now() - t0

    def summary(self) -> dict[str, float | int] | None:
        """Worst and mean of the intervals measured so far."""
        if not self.seen:
            return None
        w = sum(s.wall_s for s in self.seen)
        return {"intervals": len(self.seen), "busy_intervals": sum(s.busy for s in self.seen),
                "max_other_cores": max(s.other_cores for s in self.seen),
                "mean_other_cores": sum(s.other_cores * s.wall_s for s in self.seen) / w if w else 0.0,
                "limit_cores": self.seen[-1].allowed_cores}
