"""Plots for people (matplotlib, Agg backend): validation scatter."""
from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_validation(results, path: str | Path) -> None:
    """Projected vs measured, one marker per row, coloured by group, with +-10% / +-30% bands."""
    plt = _plt()
    done = [r for r in results if r.skipped is None and r.projected is not None]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, quantity, label in ((axes[0], "tokens_per_s_per_gpu", "tokens/s/GPU"),
                                (axes[1], "tflops_per_gpu", "TFLOP/s/GPU")):
        rows = [r for r in done if r.quantity == quantity]
        if not rows:
            ax.set_visible(False)
            continue
        groups = sorted({r.group for r in rows})
        cmap = plt.get_cmap("tab10")
        for i, g in enumerate(groups):
            rs = [r for r in rows if r.group == g]
            ax.scatter([r.measured for r in rs], [r.projected for r in rs], s=28, color=cmap(i % 10),
                       label=g[:45], alpha=0.85)
        lo = min(min(r.measured for r in rows), min(r.projected for r in rows)) * 0.8
        hi = max(max(r.measured for r in rows), max(r.projected for r in rows)) * 1.2
        xs = [lo, hi]
        ax.plot(xs, xs, "k-", lw=1)
        for f, style in ((0.1, "--"), (0.3, ":")):
            ax.plot(xs, [x * (1 + f) for x in xs], "k" + style, lw=0.7)
            ax.plot(xs, [x * (1 - f) for x in xs], "k" + style, lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"projected {label}")
        ax.set_title(f"{label}: dashed ±10%, dotted ±30%")
        ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
