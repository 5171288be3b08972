"""Kernel-level sweep on one CUDA GPU: the measurements behind the simulate-mode kernel model.

    python3 benchmarks/gpu/kernel_sweep.py [--out sweep.json]

Measures (median of repeats, CUDA events, after warm-up):
- dense GEMM TFLOP/s vs M for fixed (N, K) in bf16 and fp8 (torch._scaled_mm, per-tensor scales);
- grouped GEMM (torch._grouped_mm, bf16) vs tokens per group, G groups of [m_g x K] @ [K x N];
- the same grouped work as a python loop of per-group GEMMs (what a non-grouped expert MLP launches);
- eager launch-to-launch cost of a tiny kernel (host-bound) and copy bandwidth (HBM).
Prints one JSON document; nothing here is part of the oracle (it reads the results from docs/kernel-model.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _time_ms(fn, warm=5, reps=20) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def dense(dtype: str, ms, n: int, k: int) -> list[dict]:
    res = []
    for m in ms:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        if dtype == "fp8":
            a8 = a.to(torch.float8_e4m3fn)
            b8 = bt.to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            b = bt.t()
            fn = lambda: a @ b
        t = _time_ms(fn)
        res.append({"dtype": dtype, "m": m, "n": n, "k": k, "ms": t, "tflops": 2 * m * n * k / t / 1e9})
    return res


def grouped(groups: int, per_group, n: int, k: int) -> list[dict]:
    res = []
    for mg in per_group:
        x = torch.randn(groups * mg, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.arange(mg, groups * mg + 1, mg, device="cuda", dtype=torch.int32)
        row = {"groups": groups, "m_per_group": mg, "n": n, "k": k}
        flops = 2 * groups * mg * n * k
        try:
            t = _time_ms(lambda: torch._grouped_mm(x, w, offs=offs))
            row.update(grouped_ms=t, grouped_tflops=flops / t / 1e9)
        except Exception as exc:  # noqa: BLE001 - report what this torch build lacks
            row["grouped_error"] = repr(exc)[:200]
        xs = list(x.split(mg))
        t2 = _time_ms(lambda: [xs[i] @ w[i] for i in range(groups)])
        row.update(loop_ms=t2, loop_tflops=flops / t2 / 1e9)
        res.append(row)
    return res


def launch_and_bw() -> dict:
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    launch_us = (time.perf_counter() - t0) / n * 1e6
    big = torch.empty(2 * 1024**3 // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(big)
    t = _time_ms(lambda: dst.copy_(big), warm=3, reps=10)
    return {"eager_launch_us": launch_us, "copy_tb_per_s": 2 * big.numel() * 2 / t / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    ms = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "launch": launch_and_bw(), "dense": [], "grouped": []}
    for dt in ("bf16", "fp8"):
        out["dense"] += dense(dt, ms, 8192, 8192)
        out["dense"] += dense(dt, ms, 1536, 2048)   # a Qwen3-30B-A3B expert fc1 (2 x 768) over K=2048
    out["grouped"] += grouped(16, [32, 64, 128, 256, 512, 1024, 2048, 4096], 1536, 2048)
    out["grouped"] += grouped(8, [64, 256, 1024, 4096], 4096, 7168)   # DeepSeek-V3-like expert fc1
    s = json.dumps(out, indent=1)
    print(s)
    if a.out:
        open(a.out, "w").write(s)


if __name__ == "__main__":
    main()
