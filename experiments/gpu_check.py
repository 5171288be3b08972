"""One-call GPU check of benchmark mode: time real model layers on this machine's GPU, project multi-node
targets from them (downscale-measure-upscale), print simulate vs benchmark per layer, per op and end to end.

Run from the repository root with the system python (needs only torch, numpy, scipy, pyyaml; no install):

    bash experiments/gpu_check.sh            # or: python3 -m experiments.gpu_check

Writes ``gpu_check.json`` (and the text report) to $OUT when set, else to ./gpu_check_out/.
Without a CUDA/ROCm device it stops with a message, unless GPU_CHECK_ALLOW_CPU=1 (then it runs the
same path with tiny shapes on the CPU, to test the script itself).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

# (name, model card, target hardware, GPUs, training) - multi-node targets measured on one device at TP=1
TARGETS = [
    ("llama3.1-8b dp64", "llama3.1-8b", "h200-sxm", 64,
     {"seq_len": 8192, "gbs": 512, "mbs": 1, "tp": 1, "pp": 1, "precision": "bf16"}),
    ("llama3.1-8b tp2 pp2 dp16", "llama3.1-8b", "h200-sxm", 64,
     {"seq_len": 8192, "gbs": 512, "mbs": 1, "tp": 2, "pp": 2, "pp_schedule": "1f1b", "precision": "bf16"}),
    ("qwen3-30b-a3b ep8 pp2", "qwen3-30b-a3b", "h200-sxm", 64,
     {"seq_len": 4096, "gbs": 512, "mbs": 1, "tp": 1, "pp": 2, "ep": 8, "pp_schedule": "1f1b", "precision": "bf16"}),
    ("llama3.1-8b dp64 h100", "llama3.1-8b", "h100-sxm", 64,
     {"seq_len": 8192, "gbs": 512, "mbs": 1, "tp": 1, "pp": 1, "precision": "bf16"}),
]
CPU_TARGETS = [
    ("tiny-dense tp2 pp2", "tiny-dense", "h200-sxm", 16, {"seq_len": 256, "gbs": 16, "mbs": 1, "tp": 2, "pp": 2}),
    ("tiny-moe ep4 pp2", "tiny-moe", "h200-sxm", 16, {"seq_len": 256, "gbs": 16, "mbs": 1, "pp": 2, "ep": 4}),
]


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or "gpu_check_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import torch
    except ImportError:
        print("GPU CHECK FAILED: torch is not importable with this python", file=sys.stderr)
        return 1
    from oracle.benchmark.compare import side_by_side, side_by_side_text, upscale_text
    from oracle.benchmark.source import BenchmarkSource
    from oracle.config import RunConfig
    from oracle.errors import PrimusError
    from oracle.projector import project

    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
        print("GPU CHECK FAILED: no CUDA/ROCm device visible to torch "
              f"(torch {torch.__version__}, cuda {torch.version.cuda}); set GPU_CHECK_ALLOW_CPU=1 to test on CPU",
              file=sys.stderr)
        return 1
    targets = TARGETS if cuda else CPU_TARGETS
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    header = (f"gpu_check: device {dev}; torch {torch.__version__} cuda {torch.version.cuda} "
              f"hip {getattr(torch.version, 'hip', None)}; {len(targets)} targets")
    print(header, flush=True)
    cache = tempfile.mkdtemp(prefix="gpu_check_cache_")
    repeats = int(os.environ.get("GPU_CHECK_REPEATS", "10" if cuda else "3"))
    src = BenchmarkSource(benchmark_gpus=1, bencher_options={"cache_dir": cache, "repeats": repeats, "warmup": 3})
    report: dict = {"device": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "runs": []}
    text = [header]
    failures = 0
    t_all = time.perf_counter()
    for name, model, hw, gpus, training in targets:
        t0 = time.perf_counter()
        entry: dict = {"name": name, "model": model, "hardware": hw, "num_gpus": gpus, "training": training}
        try:
            run = RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": gpus},
                                       "training": training})
            sim = project(run, mode="simulate")
            bench = src.project(run)
            rows = side_by_side(run, src)
            st, bt = sim.tokens_per_s_per_gpu, bench.tokens_per_s_per_gpu
            entry.update(simulate_tokens_per_s_per_gpu=st, benchmark_tokens_per_s_per_gpu=bt,
                         simulate_iteration_s=sim.iteration_time_s, benchmark_iteration_s=bench.iteration_time_s,
                         fits=bench.fits, benchmark=bench.details["benchmark"], layers=rows,
                         seconds=time.perf_counter() - t0)
            block = [f"\n=== {name}: {model} on {gpus}x {hw}, {training}",
                     upscale_text(bench.details["benchmark"]), side_by_side_text(rows),
                     f"end to end tokens/s/GPU: simulate {st:,.0f}  benchmark {bt:,.0f}  "
                     f"(simulate/benchmark {st / bt:.3f}); iteration simulate {sim.iteration_time_s:.3f} s, "
                     f"benchmark {bench.iteration_time_s:.3f} s; fits: {bench.fits}; "
                     f"{time.perf_counter() - t0:.0f} s"]
        except (PrimusError, Exception) as exc:  # report every target, keep going
            failures += 1
            entry["error"] = f"{type(exc).__name__}: {exc}"
            block = [f"\n=== {name}: FAILED: {type(exc).__name__}: {exc}", traceback.format_exc()]
        print("\n".join(block), flush=True)
        text += block
        report["runs"].append(entry)
    summary = [f"\n=== summary ({time.perf_counter() - t_all:.0f} s)",
               f"{'target':<28} {'simulate tok/s/GPU':>19} {'benchmark tok/s/GPU':>20} {'sim/bench':>9}"]
    for e in report["runs"]:
        if "error" in e:
            summary.append(f"{e['name']:<28} FAILED: {e['error'][:80]}")
        else:
            s, b = e["simulate_tokens_per_s_per_gpu"], e["benchmark_tokens_per_s_per_gpu"]
            summary.append(f"{e['name']:<28} {s:>19,.0f} {b:>20,.0f} {s / b:>9.3f}")
    summary.append("GPU CHECK " + ("OK" if not failures else f"FAILED ({failures} target(s))"))
    print("\n".join(summary), flush=True)
    text += summary
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "gpu_check.txt").write_text("\n".join(text) + "\n")
    print(f"wrote {out_dir / 'gpu_check.json'} and {out_dir / 'gpu_check.txt'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
