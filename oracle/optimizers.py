"""The optimizer step: its state bytes per parameter and its time on the critical rank.

AdamW (Megatron-Core's FusedAdam over the distributed optimizer's shard) is HBM-bound: each parameter of the
shard is read and written a fixed number of bytes (ADAM_BYTES_PER_PARAM). A Muon-type optimizer (Jordan et al.
2024; Moonlight, Liu et al. 2025; Megatron-Core ``TensorParallelMuon`` under ``LayerWiseDistributedOptimizer``)
keeps fp32 master weights and one fp32 momentum, and orthogonalises each 2-D weight's update with a few
Newton-Schulz iterations: GEMMs on the matrix, so its step is compute work that grows with the matrix sizes, not
only with the parameter count. Megatron-Core distributes whole matrices over the data-parallel ranks (layer-wise)
and orthogonalises each tensor-parallel shard on its own (``muon_tp_mode='blockwise'``, the default); the routed
experts' matrices are dealt over the expert data-parallel ranks instead (their parameter groups are
``is_expert_parallel``: ``layer_wise_optimizer.py`` shards them on ``expt_dp``); embeddings, the output layer and
1-D parameters stay on AdamW.
"""
from __future__ import annotations

from functools import lru_cache

from oracle.gemm import gemm_time_s, memory_bound_time_s
from oracle.opgraph import GEMM, Op

ADAM_BYTES_PER_PARAM = 34
"""Adam step traffic per parameter shard: read fp32 master, grad, m, v (16 B), write master, m, v (12 B) and the
bf16 weight (2 B), plus a grad-norm pass (4 B): multi-tensor-apply kernels are HBM bound."""
MUON_BYTES_PER_PARAM = 26
"""Muon's elementwise traffic per parameter: read master, grad, momentum (12 B), write momentum and master (8 B) and
the bf16 weight (2 B), plus the grad-norm pass (4 B); the Newton-Schulz GEMMs come on top."""
ADAM_STATE_BYTES = 12
"""fp32 master weight + Adam m + v."""
MUON_STATE_BYTES = 8
"""fp32 master weight + momentum (Muon keeps no second moment)."""
STEP_KERNELS = 8
"""Launches of the fused multi-tensor step (a floor for tiny shards)."""


def state_bytes_per_param(optimizer: str, matrix_share: float) -> float:
    """Optimizer-state bytes per parameter of a shard whose ``matrix_share`` are 2-D weights Muon updates."""
    if optimizer == "muon":
        return MUON_STATE_BYTES * matrix_share + ADAM_STATE_BYTES * (1.0 - matrix_share)
    return float(ADAM_STATE_BYTES)


@lru_cache(maxsize=65536)
def newton_schulz_s(hw, rows: int, cols: int, steps: int) -> float:
    """Seconds of ``steps`` Newton-Schulz iterations on one [rows x cols] matrix in BF16 (Jordan et al. 2024,
    quintic iteration): with a = min, b = max of the sizes, each step forms A = X X^T (a x a, reduction b),
    B = c1 A + c2 A A (a x a, reduction a) and X' = c0 X + B X (a x b, reduction a)."""
    a, b = sorted((rows, cols))
    one = gemm_time_s(hw, a, a, b) + gemm_time_s(hw, a, a, a) + gemm_time_s(hw, a, b, a)
    return steps * one


EXPERT_MATRICES = frozenset({"experts_up", "experts_down"})
"""The routed experts' weight GEMMs (expert-parallel parameters: their optimizer group is the expert data-parallel
one, Megatron-Core ``is_expert_parallel``); shared experts, router and attention weights are dense."""


def layer_newton_schulz_s(hw, ops: list[Op], steps: int, qkv_rows: tuple[int, ...] = ()) -> tuple[float, float]:
    """(dense, routed-expert) Newton-Schulz seconds for every trainable weight matrix of one layer's op graph on
    this rank (each weight [k x n] per group: the tensor-parallel shard, orthogonalised blockwise). ``qkv_rows``:
    the fused QKV weight's Q, K and V row blocks on this rank, each orthogonalised on its own (Megatron-Core
    ``muon_split_qkv``, on by default: TensorParallelMuon splits ``linear_qkv`` by ``_get_qkv_split_shapes``)."""
    dense = expert = 0.0
    for op in ops:
        if op.kind == GEMM and op.has_wgrad:
            if op.name == "qkv" and qkv_rows and sum(qkv_rows) == op.n:
                ns = op.groups * sum(newton_schulz_s(hw, op.k, rows, steps) for rows in qkv_rows)
            else:
                ns = op.groups * newton_schulz_s(hw, op.k, op.n, steps)
            if op.name in EXPERT_MATRICES:
                expert += ns
            else:
                dense += ns
    return dense, expert


def step_time_s(run, shard_params: float, matrix_share: float, ns_s: float) -> float:
    """Optimizer step of one rank: ``shard_params`` parameters it updates (the distributed optimizer's shard),
    ``matrix_share`` of them 2-D weights; ``ns_s`` the Newton-Schulz seconds of the whole matrices this rank owns
    (Muon only; Megatron-Core's LayerWiseDistributedOptimizer deals dense matrices over the data-parallel ranks and
    routed-expert ones over the expert data-parallel ranks)."""
    hw, t = run.cluster.hardware, run.training
    if t.optimizer == "muon":
        per = MUON_BYTES_PER_PARAM * matrix_share + ADAM_BYTES_PER_PARAM * (1.0 - matrix_share)
        return memory_bound_time_s(hw, per * shard_params, STEP_KERNELS) + ns_s
    return memory_bound_time_s(hw, ADAM_BYTES_PER_PARAM * shard_params, STEP_KERNELS)
