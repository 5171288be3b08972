"""Benchmark mode: real torch layers timed on the local device, restored to the target (paper Sec. 3.1,
Algorithm 1). Importing this package does not import torch; measuring does.

* :mod:`oracle.benchmark.spec` - the layer signature (a rank's share of a layer at the benchmark shape)
* :mod:`oracle.benchmark.torch_layers` - torch modules built from a spec (attention, MLP, MoE, norms ...)
* :mod:`oracle.benchmark.timing` - warm-up, device sync, medians; per-op and optimizer timing
* :mod:`oracle.benchmark.cache` - on-disk measurement cache
* :mod:`oracle.benchmark.source` - BenchmarkSource, the benchmark LayerTimeSource (downscale/measure/upscale)
* :mod:`oracle.benchmark.compare` - ``both`` mode: simulate vs benchmark per layer and op
"""
from __future__ import annotations


def default_benchmark_gpus() -> int:
    """Devices present (CUDA/ROCm GPUs), or 1 on a CPU-only machine."""
    try:
        import torch
    except ImportError:
        return 1
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
