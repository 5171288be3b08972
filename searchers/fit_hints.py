"""What to change so a configuration that does not fit in memory does: its one-change neighbours that fit.

``raytune-primus project`` prints them under a projection whose memory is over the cap. Each candidate changes one
thing the user would reach for first, in the search space's own terms (:class:`~searchers.space.SearchSpace` around
the run: its legal values, its derived pipeline layouts, its legality check): a memory saver (the fused attention
kernel in place of unfused attention's score matrices, selective or full recompute, the distributed optimizer, FSDP),
a smaller micro-batch, or twice the tensor, pipeline, context or expert
parallelism. Every legal one is projected (simulate mode, as ``project --set CHANGE`` projects it); those that fit are
returned fastest first. The numerics (precision, FP8 recipe, token dropping) are never changed: they change the
training."""
from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.config import RunConfig, TrainingConfig
from oracle.errors import PrimusError
from oracle.hardware import bundled_hardware, bundled_hardware_name
from oracle.legality import check as legality_check
from oracle.model_card import bundled_model_name, is_bundled_model
from oracle.units import GIB
from searchers.space import SearchSpace

KERNEL_CHOICES = frozenset({"attention_backend"})
"""Candidate keys that no search space opens (a kernel choice, not a layout): tried on the run as it is."""
MAX_HINTS = 5
"""Hints printed at most (the fastest that fit)."""


@dataclass(frozen=True, slots=True)
class FitHint:
    """One change that makes the run fit, with what it projects to."""

    change: dict[str, Any]
    """The training keys changed, with their new values."""
    peak_gib: float
    cap_gib: float
    tokens_per_s_per_gpu: float

    @property
    def label(self) -> str:
        return " ".join(f"{k}={_show(v)}" for k, v in self.change.items())

    def to_dict(self) -> dict[str, Any]:
        return {"change": dict(self.change), "peak_gib": self.peak_gib, "cap_gib": self.cap_gib,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu}


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _changes(run: RunConfig) -> list[dict[str, Any]]:
    """The one-change candidates, in the order a user would try them (duplicates and no-ops dropped later)."""
    t: TrainingConfig = run.training
    out: list[dict[str, Any]] = []
    if t.attention_backend == "unfused":  # the fused kernel keeps no score matrix
        out.append({"attention_backend": "auto"})
    if t.recompute in ("none", "selective"):
        out += [{"recompute": r} for r in (("selective", "full") if t.recompute == "none" else ("full",))]
    if not t.use_distributed_optimizer and not t.fsdp:
        out.append({"use_distributed_optimizer": True})
    if not t.fsdp:
        out.append({"fsdp": True})
    if t.mbs > 1:
        out += [{"mbs": t.mbs // 2}] + ([{"mbs": 1}] if t.mbs > 2 else [])
    out += [{"tp": 2 * t.tp}, {"pp": 2 * t.pp}, {"cp": 2 * t.cp}]
    if run.model.is_moe:
        out.append({"ep": 2 * t.ep})
    return out


def fit_hints(run: RunConfig, limit: int = MAX_HINTS) -> tuple[list[FitHint], int, int]:
    """(the one-change neighbours of ``run`` that fit, fastest first, at most ``limit``; how many fit; how many legal
    ones were projected). Nothing is raised for a candidate: an illegal or failing one is left out."""
    from oracle.projector import project

    try:
        space = SearchSpace(run)
    except PrimusError:  # a run the search space cannot be built around: no hints, the projection stands
        return [], 0, 0
    base = space.baseline.training
    hints: list[FitHint] = []
    tried = 0
    seen: set[tuple] = set()
    for change in _changes(run):
        key = tuple(sorted(change.items()))
        if key in seen or all(getattr(base, k) == v for k, v in change.items()):
            continue
        seen.add(key)
        if set(change) <= KERNEL_CHOICES:  # not a search axis: the run itself with the change, as --set makes it
            cand = run.with_training(**change)
            problems = legality_check(cand)
        else:
            cand, problems = space.validate(change)
        if problems or cand is None:
            continue
        try:
            proj = project(cand, memory_tree=False)  # as `project --set CHANGE` would say
        except Exception:  # noqa: BLE001 - a candidate the projector refuses is not a hint
            continue
        tried += 1
        mem = proj.memory
        if mem.fits and proj.tokens_per_s_per_gpu:
            hints.append(FitHint(change, mem.peak_bytes / GIB, mem.cap_bytes / GIB, proj.tokens_per_s_per_gpu))
    hints.sort(key=lambda h: -h.tokens_per_s_per_gpu)
    return hints[:limit], len(hints), tried


def _ref(ref: str, placeholder: str, resolve: Callable[[str], str | None]) -> str:
    """``ref`` as a command line takes it: a bundled name or an existing file, quoted where it needs it; a loose
    spelling of a bundled one (``H100``, ``Meta-Llama-3.1-70B``) as the bundled name ``resolve`` gives; else (an
    inline card in a config) the placeholder of the file to write it to."""
    if ref in bundled_hardware() or is_bundled_model(ref) or Path(ref).is_file():
        return shlex.quote(ref)
    try:
        name = resolve(ref)
    except PrimusError:  # ambiguous: the placeholder, as for an inline one
        name = None
    return shlex.quote(name) if name else placeholder


def hints_text(run: RunConfig, hints: list[FitHint], n_fit: int, tried: int) -> str:
    """The lines ``project`` prints under a run that does not fit."""
    t, c = run.training, run.cluster
    model = _ref(run.model_ref or run.model.name, "CARD.yaml", bundled_model_name)
    hardware = _ref(run.hardware_ref or c.hardware.name, "PROFILE.yaml", bundled_hardware_name)
    tune = (f"raytune-primus tune --model {model} --hardware {hardware} --num-gpus {c.num_gpus} "
            f"--seq-len {t.seq_len} --gbs {t.gbs}" + (f" --precision {t.precision}" if t.precision != "bf16" else ""))
    if "CARD.yaml" in tune or "PROFILE.yaml" in tune:
        tune += " (the config's inline card or profile written to that file first)"
    if not hints:
        return (f"does not fit, and none of the {tried} legal one-change neighbours tried (memory savers, a smaller "
                f"micro-batch, twice the TP/PP/CP/EP) fits either; to search every layout: {tune}")
    width = max(len(h.label) for h in hints)
    shown = "" if len(hints) == n_fit else f", the fastest {len(hints)}"
    lines = [f"does not fit; {n_fit} of {tried} legal one-change neighbours fit (projected{shown}):",
             f"  {'change':<{width}}  peak GiB  tokens/s/GPU"]
    lines += [f"  {h.label:<{width}}  {h.peak_gib:8.1f}  {h.tokens_per_s_per_gpu:12,.0f}" for h in hints]
    lines.append(f"to search every layout: {tune}")
    return "\n".join(lines)
