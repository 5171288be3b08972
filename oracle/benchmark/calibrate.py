"""``raytune-primus hardware calibrate``: a hardware profile for the machine it runs on, from measurements.

Starts from a base profile (its peaks, capacities and citations) and replaces what can be measured here, in
the device's native dtype (bf16, or fp32 where the device has no native bf16: oracle.benchmark.dtype; the
profile's bf16 peak is then the fp32 one, as bf16 training there computes in fp32): achievable GEMM and attention
efficiency, memory bandwidth efficiency, the per-op host/launch cost,
and, with ``world > 1`` processes, the link bandwidth and latency between them over the local
torch.distributed backend (gloo on CPU, NCCL/RCCL on GPUs), fitted as time = latency + bytes / bandwidth
to point-to-point exchanges, plus the per-call cost of a collective issued between compute (the
profile's ``collective_launch_s``). On a CPU, ``threads`` cores make one "device" (peaks scale with the cores),
so ``world`` processes x ``threads`` cores describe a node of CPU "GPUs" the end-to-end trainer uses.
"""
from __future__ import annotations

import datetime
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from oracle.benchmark.dtype import choose_dtype
from oracle.benchmark.load import LoadMonitor
from oracle.benchmark.timing import default_device, device_name, pin_to_core
from oracle.errors import BenchmarkError
from oracle.hardware import load_hardware
from oracle.yamlio import load_mapping


def _median_time(fn, device: torch.device, repeats: int = 5, warmup: int = 2, stat: str = "median",
                 budget_s: float | None = None) -> float:
    """Median (or min) seconds of ``fn`` over ``repeats`` runs after ``warmup``. With ``budget_s``, a kernel
    whose first run already takes a share of the budget gets fewer runs (at least the first, timed): a
    bf16 GEMM on a CPU without bf16 units runs at ~1 GFLOP/s and would take minutes at full count."""
    ts = []
    total = warmup + repeats
    i = 0
    while i < total:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        if i == 0 and budget_s is not None and dt * total > budget_s:
            total, warmup = max(1, int(budget_s / dt)), 0  # a kernel this long is warm after one run
        if i >= warmup:
            ts.append(dt)
        i += 1
    return min(ts) if stat == "min" else statistics.median(ts)


def measure_kernels(device: torch.device, dtype: str = "bf16") -> dict[str, float | str]:
    """Achieved ``dtype`` GEMM FLOP/s (best of a few square sizes), attention fwd/bwd FLOP/s, copy bytes/s, tiny-op s
    (fastest repeat each: what the machine does when nothing else slows it down)."""
    from oracle.benchmark.torch_layers import torch_dtype
    dt = torch_dtype(dtype)
    cpu = device.type == "cpu"
    sizes = (512, 1024, 2048) if cpu else (4096, 8192)
    budget = 2.0 if cpu else None  # seconds per measurement: a forced non-native dtype on a CPU is slow
    gemm = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dt)
        b = torch.randn(n, n, device=device, dtype=dt)
        dt_s = _median_time(lambda: a @ b, device, stat="min", budget_s=budget)
        gemm = max(gemm, 2 * n ** 3 / dt_s)
        if budget is not None and dt_s > budget / 8:  # the next size costs 8x: its rate is not worth the wait
            break
    h, s, d = (8, 1024, 64) if cpu else (32, 8192, 128)
    q, k, v = (torch.randn(1, h, s, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
    fl = 4.0 * h * d * s * (s + 1) / 2  # causal QK^T + PV
    attn_f = fl / _median_time(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), device,
                               stat="min", budget_s=budget)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(out)
    attn_b = 2.5 * fl / _median_time(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), device,
                                     stat="min", budget_s=budget)
    n = (64 if cpu else 1024) * 2 ** 20
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    copy = 2 * n / _median_time(lambda: y.copy_(x), device, stat="min")
    t = torch.zeros(8, device=device)
    op = _median_time(lambda: [t.add_(1.0) for _ in range(1000)], device, stat="min") / 1000
    return {"dtype": dtype, "gemm_flops": gemm, "attention_fwd_flops": attn_f, "attention_bwd_flops": attn_b,
            "copy_bytes_per_s": copy, "tiny_op_s": op}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_worker(rank: int, world: int, port: int, threads: int, out: str, cuda: bool, dtype: str) -> None:
    import torch.distributed as dist
    if not cuda and threads == 1:
        pin_to_core(rank)
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    rows = []
    for nbytes in (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24):
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)

        def pingpong() -> None:
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        dist.barrier()
        t_min = _median_time(pingpong, dev, repeats=15, stat="min") / 2  # one direction
        t_med = _median_time(pingpong, dev, repeats=15, warmup=0) / 2
        dist.barrier()
        ar = _median_time(lambda: dist.all_reduce(buf), dev, repeats=7, stat="min")
        rows.append((nbytes, t_med, ar, t_min))
    issued = _collective_between_compute(dist, dev, rank, dtype)
    if rank == 0:
        Path(out).write_text(repr({"rows": rows, "collective_between_compute_s": issued}))
    dist.destroy_process_group()


COLLECTIVE_PROBE_BYTES = 1 << 14
COLLECTIVE_PROBE_CALLS = 200
COLLECTIVE_PROBE_LAYER = dict(kind="dense", hidden=256, mbs=1, seq_q=256, seq_k=256, heads=4, kv_heads=2, head_dim=64,
                              ffn=688)
"""The work between probe collectives: one forward+backward of a small decoder layer (a real layer's mix of
GEMMs, attention, element-wise ops and allocations; a bare GEMM loop there measured half the cost)."""


def _collective_between_compute(dist: Any, dev: torch.device, rank: int, dtype: str) -> float:
    """Mean time of a small all-to-all issued after a decoder layer's forward and backward on every rank,
    as a training step issues its dispatch/combine and gradient collectives: the backend's per-call
    hand-off, the wait for the other rank and the wake-ups of a blocked one, whose occasional long ones are
    part of the mean a run pays (a median would hide them)."""
    from oracle.benchmark import torch_layers as tl
    from oracle.benchmark.spec import LayerSpec
    from oracle.benchmark.timing import _layer_inputs
    spec = LayerSpec(**COLLECTIVE_PROBE_LAYER, dtype=dtype)
    torch.manual_seed(rank)
    layer = tl.build(spec, dev)
    (xin,) = _layer_inputs(spec, dev, tl.torch_dtype(spec.dtype))  # the input the layer benchmark times it on
    x = torch.zeros(COLLECTIVE_PROBE_BYTES // 4, dtype=torch.float32, device=dev)
    ts = []
    for i in range(COLLECTIVE_PROBE_CALLS + 10):
        y = layer(xin)
        y.backward(torch.ones_like(y))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= 10:
            ts.append(time.perf_counter() - t0)
    return float(statistics.fmean(ts))


def measure_links(world: int, threads: int = 1, cuda: bool = False, dtype: str = "bf16") -> dict[str, Any]:
    """Fit latency and bandwidth of one link from ping-pong exchanges between ``world`` local processes (the
    per-collective probe's layer computes in ``dtype``)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "links.txt")
        mp.spawn(_link_worker, args=(world, _free_port(), threads, out, cuda, dtype), nprocs=world, join=True)
        res = eval(Path(out).read_text())  # noqa: S307 - our own repr of a dict of floats and float tuples
    rows = res["rows"]
    # latency: the least-disturbed one-way time of small exchanges (the link itself; what a run pays on top
    # per call - hand-offs, waits, wake-ups - is the probe's collective_launch_s below); bandwidth: the
    # least-disturbed largest exchange beyond that latency
    small = [r[3] for r in rows if r[0] <= 1 << 17]
    lat = float(statistics.median(small))
    n_big, t_big = rows[-1][0], rows[-1][3]
    bw = float(n_big / max(t_big - min(r[3] for r in rows), t_big * 0.1))
    # per-call cost of a collective beyond the link: the small all-to-all between compute, less its transfer
    probe = res["collective_between_compute_s"]
    launch = max(0.0, probe - lat - COLLECTIVE_PROBE_BYTES / bw)
    return {"latency_s": lat, "bandwidth_bytes_per_s": bw, "collective_launch_s": launch,
            "collective_between_compute_s": probe,
            "points": [{"bytes": r[0], "p2p_median_s": r[1], "p2p_min_s": r[3], "all_reduce_s": r[2]} for r in rows]}


def calibrate(*, base: str, name: str, world: int = 1, threads: int | None = None, device: str | None = None,
              dtype: str = "auto", monitor: LoadMonitor | None = None) -> tuple[dict[str, Any], dict]:
    """(profile mapping in the YAML format of oracle.hardware, raw measurements); ``device`` 'cpu' forces the CPU
    on a machine that also has GPUs; ``dtype`` what the kernels are timed in ('auto': the device's native dtype,
    oracle.benchmark.dtype); ``monitor`` records others' load while measuring (raw 'load'). Torch's thread
    count is put back afterwards (it is process-wide)."""
    before = torch.get_num_threads()
    try:
        return _calibrate(base=base, name=name, world=world, threads=threads, device=device, dtype=dtype,
                          monitor=monitor or LoadMonitor(need_cores=need_cores(world, threads)))
    finally:
        torch.set_num_threads(before)


def need_cores(world: int, threads: int | None) -> int:
    """Cores a calibration keeps busy: ``world`` processes of ``threads`` (default: all) each, on a CPU."""
    return max(1, world) * (threads or os.cpu_count() or 1)


def _calibrate(*, base: str, name: str, world: int, threads: int | None, device: str | None, dtype: str,
               monitor: LoadMonitor) -> tuple[dict[str, Any], dict]:
    dev = torch.device(device) if device else default_device()
    cpu = dev.type == "cpu"
    if cpu and threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads() if cpu else 0
    hw = load_hardware(base)
    data = load_mapping(Path(hw.source_path) if getattr(hw, "source_path", None) else _profile_path(base),
                        "hardware profile")
    choice = choose_dtype(dev, dtype)
    md = choice.dtype  # what the kernels run in
    k, load_k = monitor.measure(lambda: measure_kernels(dev, md))
    peak_scale = threads / hw.num_compute_units if cpu else 1.0
    if not hw.supports(md):
        raise BenchmarkError(f"base profile {base} has no {md} peak (compute.peak_tflops has "
                             f"{', '.join(sorted(hw.peak_flops_per_s))}): cannot express {md} measurements on it")
    peaks = {p: v * peak_scale for p, v in hw.peak_flops_per_s.items()}
    # calibrated in fp32 (a device without native bf16, or --dtype fp32): training there computes in fp32, so the
    # profile's bf16 rows describe fp32 compute (benchmark mode's bf16/fp32 ratio on it is then 1)
    substitute = md != "bf16"
    raised = k["gemm_flops"] > peaks[md]  # the base profile's peak is below what this machine does
    if raised:
        peaks[md] = k["gemm_flops"]
    if substitute:
        peaks["bf16"] = peaks[md]
    peak = peaks[md]
    when = datetime.date.today().isoformat()
    where = f"{device_name(dev)}, torch {torch.__version__}, {when}"

    def src(what: str) -> str:
        return f"measured by `raytune-primus hardware calibrate` on {where}: {what}"
    data["name"] = name
    data["description"] = f"calibrated on {device_name(dev)}" + (f", {threads} core(s) per device" if cpu else "")
    sources = data.setdefault("sources", {})
    if cpu or raised or substitute:
        data["compute"]["peak_tflops"] = {p: round(v / 1e12, 6) for p, v in peaks.items()}
    if raised:
        sources[f"peak_{md}"] = (f"raised to the measured {md} GEMM throughput: the base profile's "
                                 f"{hw.peak_flops_per_s[md] * peak_scale / 1e12:.4f} TFLOP/s is below what this machine ran")
    if substitute:
        sources["peak_bf16"] = (f"= the {md} peak: {choice.note()}; bf16 training on this device computes in {md} "
                                f"(benchmark mode and the e2e trainer do), so its bf16 rows describe {md} compute "
                                f"(base profile bf16 peak {hw.peak_flops_per_s['bf16'] * peak_scale / 1e12:.4f} TFLOP/s)")
    sources["compute_dtype"] = choice.note()
    if cpu:
        data["compute"]["num_compute_units"] = threads
        data["memory"]["hbm_bandwidth_gb_per_s"] = round(hw.hbm_bandwidth_bytes_per_s * peak_scale / 1e9, 3)
    bw = data["memory"]["hbm_bandwidth_gb_per_s"] * 1e9
    eff = data["efficiency"]
    of = f" of the {md} peak" if md != "bf16" else ""
    eff["gemm_bf16"] = {"value": round(min(1.0, k["gemm_flops"] / peak), 4),
                        "source": src(f"best {md} matmul {k['gemm_flops'] / 1e9:,.1f} GFLOP/s{of}")}
    eff["attention_fwd"] = {"value": round(min(1.0, k["attention_fwd_flops"] / peak), 4),
                            "source": src(f"SDPA causal forward in {md} {k['attention_fwd_flops'] / 1e9:,.1f} GFLOP/s{of}")}
    eff["attention_bwd"] = {"value": round(min(1.0, k["attention_bwd_flops"] / peak), 4),
                            "source": src(f"SDPA causal backward in {md} {k['attention_bwd_flops'] / 1e9:,.1f} GFLOP/s "
                                          f"(2.5x fwd FLOPs){of}")}
    eff["hbm"] = {"value": round(min(1.0, k["copy_bytes_per_s"] / bw), 4),
                  "source": src(f"copy {k['copy_bytes_per_s'] / 1e9:,.1f} GB/s read+write")}
    for key in ("kernel_launch_s", "host_op_s"):
        if key in eff or key == "kernel_launch_s":
            eff[key] = {"value": float(f"{k['tiny_op_s']:.3g}"), "source": src("median eager 8-element add_")}
    links = load_l = None
    if world > 1:
        links, load_l = monitor.measure(lambda: measure_links(world, threads=max(1, threads), cuda=not cpu, dtype=md))
        net = data["network"]
        net["gpus_per_node"] = world
        net["scale_up"] = {**net.get("scale_up", {}), "domain_size": world,
                           "bandwidth_gb_per_s": round(links["bandwidth_bytes_per_s"] / 1e9, 4),
                           "latency_us": round(links["latency_s"] * 1e6, 2)}
        eff["collective_launch_s"] = {
            "value": float(f"{links['collective_launch_s']:.3g}"),
            "source": src(f"mean {COLLECTIVE_PROBE_BYTES // 1024} KiB all-to-all issued after a small decoder layer's "
                          f"forward+backward on each of {world} processes ({links['collective_between_compute_s'] * 1e6:,.0f} us over "
                          f"{COLLECTIVE_PROBE_CALLS} calls) less the link's latency and transfer")}
        eff["scale_up_bus"] = {"value": 1.0, "source": src(f"{world} processes over "
                                                           f"{'gloo' if cpu else 'nccl'}: the fitted link bandwidth is "
                                                           f"already the achieved one")}
    load = {name: seen.to_dict() for name, seen in (("kernels", load_k), ("links", load_l)) if seen is not None}
    busy = any(v["busy"] for v in load.values())
    sources["calibration"] = f"raytune-primus hardware calibrate (base profile {base}) on {where}"
    sources["load"] = ("; ".join(f"{name}: " + seen.text() for name, seen in (("kernels", load_k), ("links", load_l))
                                 if seen is not None) or "not known (no /proc/stat)") + \
        (" - MEASURED UNDER OTHER LOAD" if busy else "")
    return data, {"kernels": k, "links": links, "threads": threads, "device": device_name(dev),
                  "compute_dtype": choice.to_dict(), "load": load, "busy": busy}


def _profile_path(name: str) -> Path:
    from oracle.hardware import PROFILE_DIR
    p = Path(name)
    return p if p.suffix in (".yaml", ".yml") and p.exists() else Path(PROFILE_DIR) / f"{name}.yaml"
