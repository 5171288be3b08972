"""Human-readable tables for projections and validation results (plain text, aligned)."""
from __future__ import annotations

from typing import Any

from oracle.results import MemoryNode, Projection
from oracle.units import GIB


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def numerics_note(numerics: dict[str, Any]) -> str:
    """One line for people from ``SearchSpace.numerics(winner)``: which numerics-changing axes the search could
    change, and whether the winner changed any of them."""
    opened = numerics.get("open") or []
    changed = numerics.get("changed")
    base = numerics.get("baseline") or {}
    held = [f"precision {base.get('precision')}"] + (
        [f"fp8_recipe {base.get('fp8_recipe')}"] if base.get("precision") == "fp8" else []) + (
        ["FP8 activations"] if base.get("fp8_activations") else []) + (
        [] if "moe_expert_capacity_factor" not in base else ["dropless MoE"]
        if base["moe_expert_capacity_factor"] is None else [f"capacity factor {base['moe_expert_capacity_factor']}"
                                                            + (" padded" if base.get("moe_pad_expert_input_to_capacity")
                                                               else "")])
    if not opened:
        return f"numerics held as given ({', '.join(held)}): no numerics-changing axis was open"
    text = f"numerics-changing axes open: {', '.join(opened)}"
    if changed is None:
        return text
    if not changed:
        return f"{text}; the winner keeps the baseline's ({', '.join(held)})"
    return text + "; the winner changes " + ", ".join(f"{a} {_shown(base.get(a))} -> {_shown(v)}"
                                                       for a, v in changed.items())


def table(rows: list[list[Any]], header: list[str] | None = None, align: str | None = None) -> str:
    cells = [[_fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    if header:
        cells = [header] + cells
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    align = align or ("l" + "r" * (len(widths) - 1))
    lines = []
    for j, r in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if header and j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _tree_lines(node: MemoryNode, depth: int, out: list[list[str]]) -> None:
    out.append(["  " * depth + node.name, f"{node.params / 1e9:,.4f}", f"{node.activation_bytes / GIB:,.3f}"])
    for c in node.children:
        _tree_lines(c, depth + 1, out)


_LAYOUT_SHOWN = ("seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp", "ep", "etp", "precision", "recompute")


def projection_table(p: Projection) -> str:
    from oracle.config import TrainingConfig
    from oracle.schema import to_dict
    t = p.config["training"]
    default = to_dict(TrainingConfig(seq_len=1, gbs=1))
    # the layout always; every other key only where it differs from its default (the JSON output has them all)
    shown = {k: v for k, v in t.items() if k in _LAYOUT_SHOWN or (v != default.get(k) and v is not None)}
    model = p.config["model"] if isinstance(p.config["model"], str) else p.config["model"].get("name", "inline")
    hw = p.config["cluster"]["hardware"]
    lines = [f"{model} on {p.config['cluster']['num_gpus']} x {hw if isinstance(hw, str) else hw.get('name', 'inline')}  "
             f"(mode {p.mode})",
             "training: " + " ".join(f"{k}={v}" for k, v in shown.items()), ""]
    m = p.memory
    w = m.worst
    keep = m.cap_bytes / (m.hbm_bytes - m.runtime_reserved_bytes)  # 1 - cluster.memory_margin
    lines.append(f"memory per GPU (worst stage = pipeline rank {w.rank}):  "
                 f"{'FITS' if m.fits else 'DOES NOT FIT'}  peak {m.peak_bytes / GIB:,.2f} GiB  "
                 f"cap {m.cap_bytes / GIB:,.2f} GiB  (HBM {m.hbm_bytes / GIB:,.1f} - reserve "
                 f"{m.runtime_reserved_bytes / GIB:,.1f}) x {keep:.3g}")
    rows = [["parameters", w.params_bytes / GIB], ["gradients", w.grads_bytes / GIB],
            ["optimizer state", w.optimizer_bytes / GIB],
            [f"activations ({w.in_flight_microbatches:g} micro-batches in flight)", w.activations_bytes / GIB],
            ["other (buffers)", w.other_bytes / GIB], ["total", w.total_bytes / GIB]]
    lines.append(table([[r[0], f"{r[1]:,.2f}"] for r in rows], ["bucket", "GiB"]))
    if len(m.stages) > 1:
        lines.append("")
        lines.append(table([[f"rank {s.rank}", f"{s.total_bytes / GIB:,.2f}", f"{s.activations_bytes / GIB:,.2f}",
                             f"{s.in_flight_microbatches:g}"] for s in m.stages],
                           ["stage", "total GiB", "activations GiB", "in flight"]))
    if w.tree is not None:
        tree: list[list[str]] = []
        _tree_lines(w.tree, 0, tree)
        lines += ["", "memory tree of the worst stage (params in billions, activations per micro-batch in GiB):",
                  table(tree, ["module", "params (B)", "act GiB"], "lrr")]
    lines.append("")
    if p.iteration_time_s is None:
        lines.append("throughput: not projected in this mode")
    else:
        lines.append(f"throughput: {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU   {p.tflops_per_gpu:,.1f} TFLOP/s/GPU   "
                     f"MFU {100 * p.mfu:.1f}%   iteration {p.iteration_time_s:.3f} s   "
                     f"schedule {p.details.get('schedule')}  micro-batches {p.details.get('num_microbatches')}")
        b = p.breakdown
        rows = [["compute (fwd+bwd)", b.compute_s, "", b.sources.get("compute", "")],
                ["recompute", b.recompute_s, "", b.sources.get("recompute", "")],
                ["pipeline bubble", b.bubble_s, "", "analytical"]]
        if b.host_sync_s:
            rows.append(["moe host sync", b.host_sync_s, "", b.sources.get("host_sync", "")])
        for c in b.comm:
            rows.append([f"comm {c.kind}" + (f" [{c.algorithm}]" if c.algorithm else ""), c.exposed_s, c.total_s, c.source])
        rows.append(["optimizer step", b.optimizer_s, "", b.sources.get("optimizer", "")])
        lines.append(table([[r[0], f"{r[1]:.4f}", f"{r[2]:.4f}" if r[2] != "" else "", r[3]] for r in rows],
                           ["term (critical rank)", "exposed s", "total s", "source"], "lrrl"))
    for wmsg in p.warnings:
        lines.append(f"warning: {wmsg}")
    return "\n".join(lines)
