"""Downscale a target layout to the benchmark's devices (paper Algorithm 1, Sec. 3.1, App. B.2).

Benchmark mode measures layers on ``benchmark_gpus`` devices and restores the rest analytically.
Phase 1 (this module) shrinks the target while it needs more devices than the benchmark has, in the
order PP -> EP -> TP (the order of restoration error: PP is re-simulated exactly, EP keeps the per-rank
expert work and only loses the All-to-All, TP changes the slice shape); CP is never reduced.
EP is reduced with ``num_experts`` scaled by the same factor so each rank still computes
``num_experts / ep`` experts. Phase 3's restoration factors are read off the :class:`BenchPlan`.
No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from oracle.config import RunConfig
from oracle.errors import BenchmarkError


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchPlan:
    """The downscaled layout that is actually measured, and how it differs from the target."""

    target_tp: int
    target_pp: int
    target_ep: int
    target_etp: int
    target_cp: int
    target_num_experts: int
    tp: int
    pp: int
    ep: int
    etp: int
    cp: int
    num_experts: int
    benchmark_gpus: int
    steps: tuple[str, ...]
    """One line per reduction, in the order applied (e.g. 'PP 4 -> 1 (8 GPUs)')."""

    @property
    def gpus(self) -> int:
        return layout_gpus(tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, etp=self.etp)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ep if self.num_experts else 0

    @property
    def tp_compute_scale(self) -> float:
        """Factor on measured TP-split compute to get the target's (paper Alg. 1 line 21: bench_tp / target_tp)."""
        return self.tp / self.target_tp

    @property
    def etp_compute_scale(self) -> float:
        """Same for the expert GEMMs split by expert tensor parallelism."""
        return self.etp / self.target_etp

    def to_dict(self) -> dict[str, object]:
        return {"benchmark_gpus": self.benchmark_gpus, "gpus_used": self.gpus,
                "target": {"tp": self.target_tp, "pp": self.target_pp, "ep": self.target_ep, "etp": self.target_etp,
                           "cp": self.target_cp, "num_experts": self.target_num_experts},
                "bench": {"tp": self.tp, "pp": self.pp, "ep": self.ep, "etp": self.etp, "cp": self.cp,
                          "num_experts": self.num_experts},
                "steps": list(self.steps)}


def layout_gpus(*, tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
    """Fewest devices that hold one copy of a layout: pp stages of lcm(tp*cp, ep*etp) ranks (MoE parallel
    folding lets EP reuse the TP x CP x DP ranks of a stage, so DP is never needed for the benchmark)."""
    return pp * lcm(tp * cp, ep * etp)


def _largest_fitting_divisor(n: int, fits) -> int:
    for d in sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True):
        if fits(d):
            return d
    return 1


def downscale(run: RunConfig, benchmark_gpus: int) -> BenchPlan:
    """Shrink ``run``'s layout to ``benchmark_gpus`` devices: PP first (straight to the largest degree that
    fits, usually 1), then EP (num_experts scaled along), then TP (and ETP with it); never CP."""
    if benchmark_gpus < 1:
        raise BenchmarkError(f"benchmark_gpus={benchmark_gpus} must be >= 1")
    t, m = run.training, run.model
    tp, pp, ep, etp, cp = t.tp, t.pp, t.ep, t.etp, t.cp
    E = m.num_experts
    steps: list[str] = []

    def need(**kw: int) -> int:
        cur = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp}
        cur.update(kw)
        return layout_gpus(**cur)

    if need() > benchmark_gpus and pp > 1:
        new = _largest_fitting_divisor(pp, lambda d: need(pp=d) <= benchmark_gpus)
        new = 1 if need(pp=new) > benchmark_gpus else new
        steps.append(f"PP {pp} -> {new} ({need(pp=new)} GPUs)")
        pp = new
    if need() > benchmark_gpus and ep > 1:
        new = _largest_fitting_divisor(ep, lambda d: need(ep=d) <= benchmark_gpus)
        new_e = E // ep * new
        steps.append(f"EP {ep} -> {new}, num_experts {E} -> {new_e} ({E // ep} per rank kept) ({need(ep=new)} GPUs)")
        ep, E = new, new_e
    if need() > benchmark_gpus and (tp > 1 or etp > 1):
        def fits(d: int) -> bool:
            return need(tp=d, etp=min(etp, d)) <= benchmark_gpus
        new = _largest_fitting_divisor(tp, fits)
        new_etp = min(etp, new)
        while etp % new_etp:
            new_etp -= 1
        steps.append(f"TP {tp} -> {new}" + (f", ETP {etp} -> {new_etp}" if new_etp != etp else "")
                     + f" ({need(tp=new, etp=new_etp)} GPUs)")
        tp, etp = new, new_etp
    if need() > benchmark_gpus:
        raise BenchmarkError(f"the target needs {need()} benchmark GPUs even at PP=EP=TP=1 (CP={cp} is never "
                             f"reduced, paper Sec. 3.1); use --benchmark-gpus >= {need()}")
    return BenchPlan(target_tp=t.tp, target_pp=t.pp, target_ep=t.ep, target_etp=t.etp, target_cp=t.cp,
                     target_num_experts=m.num_experts, tp=tp, pp=pp, ep=ep, etp=etp, cp=cp, num_experts=E,
                     benchmark_gpus=benchmark_gpus, steps=tuple(steps))
