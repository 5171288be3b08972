"""Unit constants, defined once: SI inside the code, these at the YAML/display boundary (STYLE.md)."""
from __future__ import annotations

GIB = 2**30
"""Bytes in a GiB (capacities: HBM, memory breakdowns)."""
GB = 1e9
"""Bytes in a GB (bandwidths: GB/s)."""
TFLOPS = 1e12
"""FLOP/s in a TFLOP/s."""
US = 1e-6
"""Seconds in a microsecond (latencies)."""
