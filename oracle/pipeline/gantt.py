"""Gantt chart of a simulated pipeline: one row per rank, F/B/W coloured, micro-batch ids in boxes."""
from __future__ import annotations

from pathlib import Path

from oracle.pipeline.types import PipelineResult

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "BW": "#C44E52"}
"""Op colours (forward blue, input-gradient orange, weight-gradient green, fused backward red)."""


def draw_gantt(result: PipelineResult, path: str | Path, *, width_in: float = 14.0) -> Path:
    """Write a PNG/SVG/PDF (by suffix) Gantt chart of ``result`` to ``path``; returns the path.

    Chunk c > 0 is drawn lighter so interleaved/V chunks can be told apart; the title carries the
    schedule, makespan and mean bubble share.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    span = result.makespan_s if result.makespan_s > 0 else 1.0
    fig, ax = plt.subplots(figsize=(width_in, 0.55 * result.pp + 1.4))
    min_label_w = span * 0.012
    for r, ops, starts, ends in zip(range(result.pp), result.order, result.start_s, result.end_s):
        for op, s, e in zip(ops, starts, ends):
            alpha = 1.0 if op.chunk == 0 else max(0.35, 1.0 - 0.3 * op.chunk)
            ax.barh(r, e - s, left=s, height=0.8, color=COLOURS[op.kind], alpha=alpha, edgecolor="white", linewidth=0.4)
            if e - s >= min_label_w * max(1, len(str(op.mb))):
                ax.text((s + e) / 2, r, str(op.mb), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(result.pp))
    ax.set_yticklabels([f"rank {r}" for r in range(result.pp)])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time (s)")
    approx = " (approximate)" if result.approximate else ""
    ax.set_title(f"{result.schedule}{approx}: pp={result.pp}, vpp={result.vpp}, m={result.num_microbatches}, "
                 f"makespan {result.makespan_s:.4g} s, bubble {100 * result.bubble_fraction:.1f}%")
    kinds = sorted({op.kind for ops in result.order for op in ops}, key="F B W BW".split().index)
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in kinds], loc="upper right", fontsize=7, ncol=len(kinds))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
