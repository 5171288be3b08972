"""``project --compare-schedules`` (paper Table 6 style) and ``--gantt``: every applicable pipeline
schedule projected with the full oracle (memory, communication, bubble) for one configuration."""
from __future__ import annotations

from typing import Any

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError, PrimusError
from oracle.pipeline.schedules import SCHEDULES
from oracle.projector import pipeline_result, project
from oracle.units import GIB
from raytune_primus.report import table

VPP_OPTIONS = (2, 3, 4, 5, 6, 8)


def schedule_variants(run: RunConfig) -> list[RunConfig]:
    """Legal (schedule, vpp) variants of ``run``: 1f1b first, then the rest in registry order."""
    out = []
    for name, spec in SCHEDULES.items():
        for vpp in spec.vpp_choices((1, 2, *VPP_OPTIONS)):
            try:
                cand = RunConfig.from_dict({**run.to_dict(), "training": {
                    **run.to_dict()["training"], "pp_schedule": name, "vpp": vpp,
                    "recompute_num_layers": run.training.recompute_num_layers}})
            except InvalidConfigError:
                continue
            out.append(cand)
    return out


def compare_schedules_table(run: RunConfig) -> tuple[list[dict[str, Any]], str]:
    if run.training.pp == 1:
        raise InvalidConfigError("--compare-schedules needs pp > 1 (a pipeline); the config has pp=1")
    rows = []
    for cand in schedule_variants(run):
        try:
            p = project(cand)
        except PrimusError as exc:  # a schedule that cannot run these sizes
            rows.append({"schedule": cand.training.schedule, "vpp": cand.training.vpp, "error": str(exc)})
            continue
        b = p.breakdown
        rows.append({"schedule": cand.training.schedule, "vpp": cand.training.vpp,
                     "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "tflops_per_gpu": p.tflops_per_gpu,
                     "mfu": p.mfu, "iteration_time_s": p.iteration_time_s,
                     "bubble_fraction": b.bubble_s / p.iteration_time_s,
                     "peak_gib": p.memory.peak_bytes / GIB, "fits": p.fits,
                     "approximate": bool(p.details.get("schedule_approximate"))})
    base = next((r for r in rows if r["schedule"] == "1f1b" and "error" not in r), None)
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["schedule"], str(r["vpp"]), "-", "-", "-", "-", "-", "-", r["error"][:50]])
            continue
        sp = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"] if base else None
        lines.append([r["schedule"], str(r["vpp"]), f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['tflops_per_gpu']:,.1f}",
                      f"{100 * r['mfu']:.1f}%", f"{100 * r['bubble_fraction']:.1f}%", f"{r['peak_gib']:,.2f}",
                      f"{sp:.2f}x" if sp else "-",
                      ", ".join(n for n, on in (("does not fit", not r["fits"]),
                                                ("approximate construction", r["approximate"])) if on)])
    text = table(lines, ["schedule", "vpp", "tok/s/GPU", "TFLOP/s", "MFU", "bubble", "peak GiB", "vs 1F1B", "notes"],
                 "lrrrrrrrl")
    return rows, "pipeline schedules (every applicable one, full projection each):\n" + text


def draw_run_gantt(run: RunConfig, path: str) -> None:
    res = pipeline_result(run)
    if res is None:
        raise InvalidConfigError("--gantt needs pp > 1 (a pipeline); the config has pp=1")
    from raytune_primus.plots import gantt
    gantt(res, path)
