"""Simulate-mode kernel timing: GEMMs (tile + wave quantisation), flash attention, memory-bound ops.

No single flat MFU: a GEMM's time is the number of tile *waves* over the compute units times the
time of one tile, at the part's max achievable fraction of peak, derated for short reductions;
a memory-bound op is bytes over achievable HBM bandwidth. Every kernel costs at least the launch gap.
"""
from __future__ import annotations

from functools import lru_cache
from math import ceil

from oracle.hardware import HardwareProfile

# Candidate macro-tiles (rows x cols of C per compute unit) and their throughput relative to the
# largest tile. Smaller tiles re-read operands more often per FLOP (arithmetic intensity ~ tm*tn/(tm+tn));
# engineering estimate from CUTLASS/hipBLASLt tile sweeps: 128x128 loses ~10%, 64x128 ~25%.
TILES: tuple[tuple[int, int, float], ...] = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.9), (64, 128, 0.75))
# K-step of a tile's main loop: 128 bytes of each operand row per stage (CUTLASS SM90/SM100 default collective
# tiles: 64 x 16-bit, 128 x 8-bit, 256 x 4-bit elements); a reduction length that is not a whole number of steps
# still runs the last step whole (its tail is zero-padded)
TILE_K_BYTES = 128
VALUE_BYTES = {"bf16": 2.0, "fp8": 1.0, "mxfp8": 1.0, "fp4": 0.5}
"""Bytes of one operand value (scales aside): what a K-step's 128 bytes hold."""
# Grouped GEMMs (a MoE layer's local experts) run as one GEMM per group, launched round-robin on this
# many CUDA/HIP streams: Transformer Engine's GroupedLinear (Megatron-Core TEGroupedMLP) calls
# nvte_multi_stream_cublas_gemm with nvte_get_num_compute_streams() = 4. Concurrent kernels share the
# compute units, so each batch of 4 groups fills its own waves; the next batch starts after it.
GROUPED_GEMM_STREAMS = 4
ATTN_BLOCK_Q = 128  # FlashAttention-2/3 query block per thread block (Dao 2023; Shah et al. 2024)


# operand bytes per element; NVFP4 = 4-bit values + one fp8 scale per 16 (NVIDIA Blackwell NVFP4 format);
# MXFP8 = 8-bit values + one e8m0 scale per 32 (OCP Microscaling formats v1.0)
ELEM_BYTES = {"bf16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "fp4": 0.5 + 1.0 / 16}
_PEAK_OF = {"mxfp8": "fp8"}
"""Kernel classes that run at another dtype's peak (block-scaled MXFP8 at the FP8 rate)."""


def _dtype_peak(hw: HardwareProfile, dtype: str) -> float:
    dtype = _PEAK_OF.get(dtype, dtype)
    return hw.peak_flops_per_s[dtype] if dtype in hw.peak_flops_per_s else hw.peak_flops_per_s["bf16"]


def _runnable(hw: HardwareProfile, dtype: str) -> str:
    """The kernel class a GEMM actually runs on this part (fp4 -> fp8, mxfp8 -> fp8, fp8 -> bf16 where
    unsupported or unfitted)."""
    e = hw.efficiency
    if dtype == "fp4" and not hw.fp4_gemms:
        dtype = "fp8"
    if dtype == "mxfp8" and not hw.mxfp8_gemms:
        dtype = "fp8"
    if dtype == "fp8" and ("fp8" not in hw.peak_flops_per_s or e.gemm_fp8 <= 0):
        dtype = "bf16"
    return dtype if dtype in ("fp8", "fp4", "mxfp8") else "bf16"


@lru_cache(maxsize=65536)
def gemm_time_s(hw: HardwareProfile, m: int, n: int, k: int, dtype: str = "bf16", groups: int = 1,
                fused: bool = False, c_bytes: float = 2.0) -> float:
    """Time of ``groups`` independent (grouped) GEMMs of C[m x n] = A[m x k] B[k x n].

    time = max(waves * tile_flops / (per-unit peak * eff), operand bytes / achievable HBM BW),
    with waves = ceil(g * ceil(m/tm) * ceil(n/tn) / num_units) per batch of g <= GROUPED_GEMM_STREAMS
    concurrent groups, summed over the batches and minimised over tiles, and
    eff = max_eff(dtype) * tile_factor * k / (k + k_half). ``fused``: the groups are one kernel
    (PyTorch's torch._grouped_mm, TorchTitan's experts) whose tiles share the waves: one batch of all.
    ``c_bytes``: HBM bytes per element of C, 2 for a bf16 write; a weight-gradient GEMM that accumulates
    into the gradient buffer reads and writes it (``Op.wgrad_c_bytes``).
    """
    if m <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return 0.0
    e = hw.efficiency
    dtype = _runnable(hw, dtype)
    best = min(_tile_times(hw, m, n, k, dtype, groups, fused))[0]
    if groups > 1:  # each batch of per-expert kernels (one fused kernel: one) fills and drains its pipeline
        best += (1 if fused else ceil(groups / GROUPED_GEMM_STREAMS)) * e.grouped_gemm_overhead_s
    elem = ELEM_BYTES.get(dtype, 2)
    bytes_moved = groups * ((m * k + k * n) * elem + m * n * c_bytes)
    mem_t = bytes_moved / (hw.hbm_bandwidth_bytes_per_s * e.hbm)
    return max(best, mem_t, e.kernel_launch_s)


def _tile_times(hw: HardwareProfile, m: int, n: int, k: int, dtype: str, groups: int, fused: bool
                ) -> list[tuple[float, tuple[int, int, int]]]:
    """(compute seconds, (tm, tn, tk)) of each candidate tile for ``gemm_time_s`` (``dtype`` already runnable)."""
    e = hw.efficiency
    max_eff = {"fp8": e.gemm_fp8, "fp4": e.gemm_fp4, "mxfp8": e.gemm_mxfp8}.get(dtype, e.gemm_bf16)
    if groups > 1:  # grouped expert GEMMs: their own fraction of the dense kernel's (efficiency.gemm_grouped)
        max_eff *= e.gemm_grouped
    peak_per_unit = _dtype_peak(hw, dtype) / hw.num_compute_units
    k_factor = k / (k + e.gemm_k_half)
    tk = int(TILE_K_BYTES / VALUE_BYTES.get(dtype, 2.0))
    k_run = ceil(k / tk) * tk  # the reduction steps the kernel runs
    per_batch = groups if fused else min(groups, GROUPED_GEMM_STREAMS)
    batches, rest = divmod(groups, per_batch)
    units = hw.num_compute_units
    out = []
    for tm, tn, tile_eff in TILES:
        tiles = ceil(m / tm) * ceil(n / tn)
        waves = batches * ceil(per_batch * tiles / units) + (ceil(rest * tiles / units) if rest else 0)
        out.append((waves * (2.0 * tm * tn * k_run) / (peak_per_unit * max_eff * tile_eff * k_factor), (tm, tn, tk)))
    return out


def gemm_tile(hw: HardwareProfile, m: int, n: int, k: int, dtype: str = "bf16", groups: int = 1,
              fused: bool = False) -> tuple[int, int, int]:
    """The (rows, columns, K-step) tile ``gemm_time_s`` runs this GEMM with (its fastest candidate)."""
    return min(_tile_times(hw, m, n, k, _runnable(hw, dtype), groups, fused))[1]


ATTN_BLOCK_K = 128  # key block per inner iteration (FlashAttention-2/3 and cuDNN's fused attention at head dim 128)


@lru_cache(maxsize=4096)
def visited_keys(seq: int, window: int | None) -> float:
    """Keys per query a tiled causal attention kernel computes, averaged over the sequence: every key block a
    query block touches, masked positions included (the diagonal block is computed whole; a sliding window of
    w keys touches ceil((w + block - 1) / block) blocks or so, not w keys)."""
    if seq <= 0:
        return 0.0
    total = 0
    for i in range(ceil(seq / ATTN_BLOCK_Q)):
        q0, q1 = i * ATTN_BLOCK_Q, min(seq, (i + 1) * ATTN_BLOCK_Q) - 1
        k_lo = 0 if window is None else max(0, q0 - window + 1)
        total += (q1 // ATTN_BLOCK_K - k_lo // ATTN_BLOCK_K + 1) * ATTN_BLOCK_K * (q1 - q0 + 1)
    return total / seq


@lru_cache(maxsize=16384)
def attention_time_s(hw: HardwareProfile, batch_heads: int, s_q: int, s_k_avg: float, d_qk: int, d_v: int,
                     backward: bool = False, seq: int = 0, window: int | None = None, dtype: str = "bf16") -> float:
    """FlashAttention-style tile model for one rank.

    Work is split into query blocks of ATTN_BLOCK_Q rows, one thread block each; waves over the compute
    units quantise it. Each block computes QK^T (2 d_qk) and PV (2 d_v) FLOPs per (query, key) pair it
    visits (``visited_keys`` over ``seq``: whole key tiles under the causal mask or sliding window; without
    ``seq``, ``s_k_avg`` keys) on the tensor cores of ``dtype`` (fp8: FP8 fused attention), and one
    exponential per pair on the special-function units: softmax exponentials are a separate, slower pipe
    (H100: 3.9 T/s against 989 TFLOP/s of BF16 matmul, Shah et al. 2024, FlashAttention-3 Sec. 3.1); the
    kernel hides ``efficiency.attention_exp_overlap`` of the shorter of the two behind the longer, so at head
    dim 64 or in FP8, where the exponentials are as long as the matmuls, attention gains little. The
    backward recomputes the scores (one exponential per pair again) and forms dP, dV, dQ, dK: 2.5x the
    forward matmul FLOPs (FlashAttention-2 paper).
    """
    if batch_heads <= 0 or s_q <= 0:
        return 0.0
    e = hw.efficiency
    units = hw.num_compute_units
    blocks = batch_heads * ceil(s_q / ATTN_BLOCK_Q)
    waves = ceil(blocks / units)
    keys = visited_keys(seq, window) if seq > 0 else s_k_avg
    pairs_block = ATTN_BLOCK_Q * keys
    flops_block = 2.0 * pairs_block * (d_qk + d_v)
    eff = e.attention_fwd
    if backward:
        flops_block *= 2.5
        eff = e.attention_bwd
    peak = hw.peak_flops_per_s["fp8" if dtype == "fp8" and hw.supports("fp8") else "bf16"]
    t_block = flops_block / (peak / units * eff)
    if hw.peak_exp_per_s > 0:
        t_exp = pairs_block / (hw.peak_exp_per_s / units)
        t_block = max(t_block, t_exp) + (1.0 - e.attention_exp_overlap) * min(t_block, t_exp)
    return max(waves * t_block, e.kernel_launch_s)


def memory_bound_time_s(hw: HardwareProfile, nbytes: float, kernels: int = 1) -> float:
    """Bytes over achievable HBM bandwidth; each of ``kernels`` launches costs at least the launch gap."""
    if nbytes <= 0:
        return 0.0
    return max(nbytes / (hw.hbm_bandwidth_bytes_per_s * hw.efficiency.hbm), kernels * hw.efficiency.kernel_launch_s)
