"""What-if: the published MoE rows projected eager and with CUDA graphs.

    python benchmarks/whatif_cuda_graphs.py [../shared/validation/published-nvidia.csv]

NVIDIA's tables do not say whether a run captured CUDA graphs (Megatron-Core ``--cuda-graph-impl`` /
``--cuda-graph-scope``), so ``validate`` prices every row eager. This script projects the newest-release
MoE rows three ways: eager, with Transformer Engine graphs of the attention block and the router
(``attn`` + ``moe_router``: what a dropless MoE layer allows), and with the whole layer captured where the
shapes are static (token-drop with padding). It assumes nothing; it measures how far graphs would move
each projection. docs/kernel-model.md ("CUDA graphs") quotes its output.
"""
from __future__ import annotations

import dataclasses
import statistics

from whatif_rows import newest_moe_rows

from oracle.legality import check
from oracle.projector import project
from oracle.validate import validate_rows

VARIANTS = {"attn+router": ("attn", "moe_router"), "whole layer": ()}


def _graphed(run, scope: tuple[str, ...]):
    """``run`` with TE CUDA graphs of ``scope``, or None where Megatron (or the dispatcher's sync) refuses it."""
    on = dataclasses.replace(run, training=run.training.replace(cuda_graph_impl="transformer_engine",
                                                                cuda_graph_scope=scope))
    return None if check(on) else on


def main() -> int:
    path, rows, eager, moe = newest_moe_rows(__doc__.splitlines()[0])
    results = {}
    for name, scope in VARIANTS.items():
        def project_with(run, scope=scope):
            on = _graphed(run, scope)
            return project(run if on is None else on)
        results[name] = {r.id: r for r in validate_rows([r for r in rows if r in moe], project_fn=project_with,
                                                         base_dir=path.parent)}
    print(f"{'row':48s} {'measured':>9s} {'eager':>8s} " + " ".join(f"{n:>12s}" for n in VARIANTS))
    signed: dict[str, list[float]] = {"eager": [], **{n: [] for n in VARIANTS}}
    for r in moe:
        a = eager[r["id"]]
        cells = []
        for name in VARIANTS:
            b = results[name][r["id"]]
            legal = b.projection.config["training"]["cuda_graph_impl"] != "none"  # priced with the graphs
            cells.append(f"{100 * b.error:+11.1f}%" if legal else f"{'(illegal)':>12s}")
            if legal:
                signed[name].append(b.error)
        signed["eager"].append(a.error)
        print(f"{r['id']:48s} {a.measured:9,.0f} {100 * a.error:+7.1f}% " + " ".join(cells))
    print()
    for name, errs in signed.items():
        if errs:
            print(f"{name:12s} n={len(errs):2d}  median signed {100 * statistics.median(errs):+.1f}%  "
                  f"median |error| {100 * statistics.median(map(abs, errs)):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
