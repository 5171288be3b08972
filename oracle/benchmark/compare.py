"""``both`` mode: simulate and benchmark side by side, per layer type and per op (paper Table 13 idea).

Per-op rows line the measured torch ops up with the simulate op graph's ops (oracle.opgraph names); a
measured op may cover several simulated ones (the measured ``attn_core`` includes RoPE and qk-norm, the
measured ``router`` its softmax/top-k), listed in :data:`OP_GROUPS`. Residual adds are only inside the
whole-layer numbers.
"""
from __future__ import annotations

from typing import Any

from oracle.benchmark.source import BenchmarkSource, MeasuredLayerModel
from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.layout import Layout
from oracle.projector import comm_model

OP_GROUPS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("attn_norm",),
    "qkv": ("qkv", "q_down", "q_up", "q_proj", "kv_down", "kv_up", "q_norm", "kv_norm"),
    "attn_core": ("attn_core", "rope", "qk_norm"),
    "attn_out": ("attn_out", "attn_quant"),
    "mlp_norm": ("mlp_norm",),
    "mlp_up": ("mlp_up",),
    "mlp_act": ("mlp_act", "mlp_quant"),
    "mlp_down": ("mlp_down",),
    "router": ("router", "router_topk"),
    "permute": ("permute",),
    "experts_up": ("experts_up",),
    "experts_act": ("experts_act", "experts_quant"),
    "experts_down": ("experts_down",),
    "unpermute": ("unpermute",),
    "shared_mlp": ("shared_up", "shared_act", "shared_down", "shared_quant"),
}


def _sim_ops(lm: LayerModel, run: RunConfig, kind: str, window: int | None) -> dict[str, tuple[float, float, float]] | None:
    """Simulated (f, b, w) per op of one layer, from the op graph when this oracle has one."""
    price = getattr(lm, "price", None)
    try:
        from oracle.opgraph import Shapes, layer_ops
    except ImportError:
        return None
    if price is None:
        return None
    out: dict[str, tuple[float, float, float]] = {}
    for op in layer_ops(run.model, Shapes.of(run), kind, window):
        f, b, w = price(op)
        a = out.get(op.name, (0.0, 0.0, 0.0))
        out[op.name] = (a[0] + f, a[1] + b, a[2] + w)
    return out


def side_by_side(run: RunConfig, source: BenchmarkSource) -> list[dict[str, Any]]:
    """One entry per distinct layer type: simulate vs benchmark (upscaled to the target) f/b/w, and per op."""
    L = Layout(run)
    comm = comm_model(run.cluster.hardware, run.cluster.num_gpus)
    sim = LayerModel(L, comm)
    bench = MeasuredLayerModel(L, comm, source)
    rows = []
    for (kind, window), spec in source.specs(run).items():
        if kind == "optimizer":
            continue
        if kind in ("embedding", "output"):
            sf = sim.embedding() if kind == "embedding" else sim.output()
            bf = bench.embedding() if kind == "embedding" else bench.output()
            sf, bf = (tuple(sf) + (0.0,))[:3], (tuple(bf) + (0.0,))[:3]
            rows.append({"layer": kind, "shape": spec.label(), "simulate": dict(zip(("f_s", "b_s", "w_s"), sf)),
                         "benchmark": dict(zip(("f_s", "b_s", "w_s"), bf)), "ops": []})
            continue
        sc, bc = sim.layer(kind, window), bench.layer(kind, window)
        scaled = bench._scale(kind, window)
        ops = []
        sim_ops = _sim_ops(sim, run, kind, window)
        for name, t in scaled.raw.ops.items():
            k = bench._op_factor(name)
            row: dict[str, Any] = {"op": name, "benchmark": {"f_s": t.f_s * k, "b_s": t.b_s * k, "w_s": t.w_s * k}}
            if sim_ops is not None:
                parts = [sim_ops[n] for n in OP_GROUPS.get(name, (name,)) if n in sim_ops]
                if parts:
                    row["simulate"] = {"f_s": sum(p[0] for p in parts), "b_s": sum(p[1] for p in parts),
                                       "w_s": sum(p[2] for p in parts)}
            ops.append(row)
        rows.append({"layer": kind + (f"/window={window}" if window else ""), "shape": spec.label(),
                     "simulate": {"f_s": sc.f_s, "b_s": sc.b_s, "w_s": sc.w_s},
                     "benchmark": {"f_s": bc.f_s, "b_s": bc.b_s, "w_s": bc.w_s}, "upscale_factor": scaled.factor,
                     "ops": ops})
    return rows


def _ms(x: float) -> str:
    return f"{1e3 * x:,.3f}"


def side_by_side_text(rows: list[dict[str, Any]]) -> str:
    """Plain table: per layer and op, simulate vs benchmark forward / backward(B+W) in ms and their ratio."""
    out = [f"{'layer / op':<28} {'sim F ms':>10} {'bench F ms':>10} {'sim B+W ms':>11} {'bench B+W ms':>12} "
           f"{'bench/sim':>9}"]
    for r in rows:
        items = [(r["layer"], r["simulate"], r["benchmark"])]
        items += [("  " + o["op"], o.get("simulate"), o["benchmark"]) for o in r["ops"]]
        for name, s, b in items:
            bt = b["f_s"] + b["b_s"] + b["w_s"]
            if s is None:
                out.append(f"{name:<28} {'-':>10} {_ms(b['f_s']):>10} {'-':>11} {_ms(b['b_s'] + b['w_s']):>12} {'-':>9}")
                continue
            st = s["f_s"] + s["b_s"] + s["w_s"]
            ratio = f"{bt / st:.2f}" if st > 0 else "-"
            out.append(f"{name:<28} {_ms(s['f_s']):>10} {_ms(b['f_s']):>10} {_ms(s['b_s'] + s['w_s']):>11} "
                       f"{_ms(b['b_s'] + b['w_s']):>12} {ratio:>9}")
    return "\n".join(out)


def upscale_text(report: dict[str, Any]) -> str:
    """The downscale plan, measured layers and each analytical term added at upscale (benchmark details)."""
    plan, up = report["plan"], report["upscale"]
    lines = [f"benchmark: {plan['benchmark_gpus']} device(s); measured layout "
             + ", ".join(f"{k}={v}" for k, v in plan["bench"].items())
             + "; downscale: " + ("; ".join(plan["steps"]) or "none (the target fits)")]
    if report.get("device_note"):
        lines.append(f"  {report['device_note']}")
    for name, e in report["layers"].items():
        timed = f", timed in {e['measured_dtype']}" if e.get("measured_dtype", e.get("dtype")) != e.get("dtype") else ""
        line = (f"  measured {name:<16} F {_ms(e['measured_f_s'])} ms  B {_ms(e['measured_b_s'])} ms  "
                f"W {_ms(e['measured_w_s'])} ms  ({e['shape']}{timed}; spread {100 * e['spread']:.0f}%)")
        if "upscale_factor" in e and abs(e["upscale_factor"] - 1) > 1e-9:
            line += f"  x{e['upscale_factor']:.3f} at upscale"
        lines.append(line)
    if report.get("compute_dtype"):
        lines.append(f"  {report['compute_dtype']['note']}")
    if report.get("dtype_note"):
        lines.append(f"  dtype: {report['dtype_note']}")
    if report.get("busy_layers"):
        lines.append(f"  warning: {len(report['busy_layers'])} layer(s) measured while other processes used the machine "
                     f"(not cached; rerun on an idle machine): {'; '.join(report['busy_layers'])}")
    if report.get("fp8_note"):
        lines.append(f"  fp8: {report['fp8_note']} ({report['fp8_gemm_speedup']:.2f}x)")
    lines.append(f"upscale (per iteration, critical rank): measured compute {up['measured_compute_s']:.4f} s; "
                 f"PP bubble {up['pp_bubble_s']:.4f} s; TP compute x{up['tp_compute_scale']:.3f}, "
                 f"TP comm exposed {up['tp_comm_s']:.4f} s; EP A2A delta {up['ep_a2a_delta_s']:.4f} s; "
                 f"optimizer {report['optimizer_s']:.4f} s (measured)")
    lines.append(f"  {up['note']}")
    return "\n".join(lines)
