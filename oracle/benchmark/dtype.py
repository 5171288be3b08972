"""Which dtype benchmark mode times layers in on this device: bf16 where the device runs it natively, else fp32.

A CPU without bf16 instructions (AVX2 only: no AVX512-BF16, no AMX) runs torch's bf16 matmul on a
reference path at ~1 GFLOP/s per core against ~90 GFLOP/s in fp32 (measured on a 2-core AMD EPYC AVX2
host, torch 2.13.0+cpu, 256^3 GEMM): a bf16 measurement there describes the emulation, not the device. The
choice is by capability (GPU: ``torch.cuda.is_bf16_supported``; CPU: the ``avx512_bf16`` / ``amx_bf16``
flags on x86, ``bf16`` on Arm), guarded by a short measured probe: a capable device whose bf16 GEMM runs
below ``MIN_NATIVE_BF16_RATIO`` of its fp32 rate (a torch build that does not use the units) is timed in
fp32 too; where the capability cannot be read the probe alone decides. What the target computes in bf16
(or fp8) is then priced from the fp32 measurement by the target profile's throughput ratio
(:func:`oracle.benchmark.source.dtype_speedup`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("auto", "bf16", "fp32")
"""What a user may ask for: 'auto' (by capability), or a dtype forced."""
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 /proc/cpuinfo flags of bf16 arithmetic units (AVX512-BF16 dot products, AMX-BF16 tiles)."""
ARM_BF16_FEATURES = ("bf16",)
"""Arm /proc/cpuinfo features of bf16 arithmetic (FEAT_BF16: BFDOT/BFMMLA)."""
MIN_NATIVE_BF16_RATIO = 0.5
"""A native bf16 GEMM runs at least at the fp32 rate (2x peak with AVX512-BF16/AMX or tensor cores); an
emulated one at ~1% of it (1.0 vs 88 GFLOP/s on the AVX2 host above). Half leaves room for probe noise."""
PROBE_N = 256
"""Square GEMM size of the probe (33.6 MFLOP: ~35 ms at an emulated 1 GFLOP/s, well under 1 ms native)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeDtype:
    """The dtype benchmark mode times layers in on one device, and why."""

    dtype: str
    """'bf16' or 'fp32': what the layers are timed in."""
    requested: str = "auto"
    """'auto' (by capability) or the dtype the user forced."""
    bf16_native: bool | None = None
    """Capability: the device has bf16 arithmetic units (None: it could not be read)."""
    capability: str = ""
    """Where the capability was read from (flags found or missing, the CUDA query)."""
    probe_flops_per_s: dict[str, float] = field(default_factory=dict)
    """A PROBE_N^3 GEMM's rate per dtype on this device ({} where no probe ran)."""

    @property
    def native(self) -> bool:
        """True when the layers run in the device's own bf16 (nothing to re-price)."""
        return self.dtype == "bf16"

    def note(self) -> str:
        """One line for the output: the dtype, and the evidence."""
        probe = ", ".join(f"{k} {v / 1e9:,.1f}" for k, v in self.probe_flops_per_s.items())
        probe = f"; probe {PROBE_N}^3 GEMM GFLOP/s: {probe}" if probe else ""
        if self.requested != "auto":
            why = f"forced by --dtype {self.requested}"
        elif self.dtype == "bf16":
            why = "the device runs bf16 natively"
        elif self.bf16_native:
            why = f"bf16 units present but torch's bf16 GEMM ran below {MIN_NATIVE_BF16_RATIO:.0%} of fp32"
        else:
            why = "the device has no native bf16"
        return f"layers timed in {self.dtype}: {why} ({self.capability}{probe})"

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "requested": self.requested, "bf16_native": self.bf16_native,
                "capability": self.capability, "probe_flops_per_s": dict(self.probe_flops_per_s),
                "note": self.note()}


def _cpu_flags() -> set[str] | None:
    """Lower-case flags/features of the first CPU in /proc/cpuinfo (None where unreadable)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, val = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return set(val.lower().split())
    except OSError:
        return None
    return None


def bf16_capability(device: Any) -> tuple[bool | None, str]:
    """(has bf16 units, evidence) of a torch device; None when it cannot be told (the probe decides)."""
    import torch
    if device.type == "cuda":
        ok = bool(torch.cuda.is_bf16_supported())
        return ok, f"torch.cuda.is_bf16_supported() = {ok} on {torch.cuda.get_device_name(device)}"
    flags = _cpu_flags()
    isa = torch.backends.cpu.get_cpu_capability()
    if flags is None:
        return None, f"CPU flags unreadable; torch CPU capability {isa}"
    found = sorted(f for f in (*CPU_BF16_FLAGS, *ARM_BF16_FEATURES) if f in flags)
    if found:
        return True, f"CPU flags {', '.join(found)}; torch CPU capability {isa}"
    return False, f"no {'/'.join(CPU_BF16_FLAGS)} in the CPU flags; torch CPU capability {isa}"


def gemm_probe(device: Any, dtypes: tuple[str, ...] = ("bf16", "fp32"), *, repeats: int = 3,
               min_s: float = 0.02) -> dict[str, float]:
    """FLOP/s of a PROBE_N^3 matmul per dtype: the fastest of at least ``repeats`` runs (and ``min_s`` seconds)
    after one warm-up. On a CPU with one torch thread: the question is the dtype's kernel path, and spinning
    OpenMP threads on a shared machine slow a short probe 10-40x."""
    import torch

    from oracle.benchmark.torch_layers import torch_dtype
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    out = {}
    try:
        for name in dtypes:
            a = torch.randn(PROBE_N, PROBE_N, device=device, dtype=torch_dtype(name))
            b = torch.randn(PROBE_N, PROBE_N, device=device, dtype=torch_dtype(name))
            best, spent, i = float("inf"), 0.0, 0
            while i <= repeats or spent < min_s:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                a @ b
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                if i:
                    best, spent = min(best, dt), spent + dt
                i += 1
            out[name] = 2 * PROBE_N ** 3 / max(best, 1e-9)
    finally:
        torch.set_num_threads(threads)
    return out


_CHOSEN: dict[tuple[str, str, int], ComputeDtype] = {}


def choose_dtype(device: Any, requested: str = "auto") -> ComputeDtype:
    """The dtype to time layers in on ``device``: ``requested`` when forced, else bf16 where the device has
    bf16 units (and, on a CPU, the probe confirms torch uses them), fp32 otherwise. Decided once per process,
    device and torch thread count."""
    import torch
    if requested not in DTYPES:
        from oracle.errors import BenchmarkError
        raise BenchmarkError(f"dtype={requested!r} is not one of {', '.join(DTYPES)}")
    key = (str(device), requested, torch.get_num_threads())
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    cap, evidence = bf16_capability(device)
    probe: dict[str, float] = {}
    if requested != "auto":
        dtype = requested
    elif device.type == "cuda":
        dtype = "bf16" if cap else "fp32"
    else:
        probe = gemm_probe(device)
        fast = probe["bf16"] >= MIN_NATIVE_BF16_RATIO * probe["fp32"]
        dtype = "bf16" if (cap if cap is not None else True) and fast else "fp32"
    choice = ComputeDtype(dtype=dtype, requested=requested, bf16_native=cap, capability=evidence,
                          probe_flops_per_s=probe)
    _CHOSEN[key] = choice
    return choice


def forget_choices() -> None:
    """Drop the per-process decisions (tests that patch the capability)."""
    _CHOSEN.clear()
