"""The dispatcher's token copies are priced by the dispatcher that runs (oracle.opgraph._permute_op)."""
from __future__ import annotations

import pytest

from oracle.config import RunConfig
from oracle.opgraph import BF16, Shapes, layer_ops, moe_pairs


def _run(backend: str, ep: int) -> RunConfig:
    return RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                "training": {"seq_len": 4096, "gbs": 64, "ep": ep, "precision": "bf16",
                                             "moe_a2a_backend": backend}})


def _permute(run: RunConfig):
    s = Shapes.of(run)
    return next(op for op in layer_ops(run.model, s, "moe") if op.name == "permute"), s


@pytest.mark.parametrize("ep", [2, 8])
def test_alltoall_dispatcher_sorts_received_rows_by_local_expert(ep):
    """Megatron-Core's all-to-all dispatcher regroups the k*T received rows by local expert after the dispatch
    and restores them before the combine: one read + write of them each way beyond the flex dispatchers'
    permute / unpermute (read T + write k*T each way)."""
    run = _run("alltoall", ep)
    a2a, s = _permute(run)
    flex, _ = _permute(_run("deepep", ep))
    H, pairs = run.model.hidden_size, moe_pairs(run.model, s)
    assert flex.bytes_f == BF16 * 2 * (s.T_sp * H + pairs * H)
    assert a2a.bytes_f - flex.bytes_f == pytest.approx(BF16 * 4 * pairs * H)
    assert a2a.kernels > flex.kernels


def test_one_local_expert_needs_no_sort():
    """With one expert per rank the received rows are already grouped: the all-to-all dispatcher moves what
    the flex dispatchers do."""
    def run_with(backend: str) -> RunConfig:
        return RunConfig.from_dict({"model": "mixtral-8x7b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                    "training": {"seq_len": 4096, "gbs": 64, "ep": 8, "precision": "bf16",
                                                 "moe_a2a_backend": backend}})
    run, deep = run_with("alltoall"), run_with("deepep")
    assert run.model.num_experts // 8 == 1
    assert _permute(run)[0].bytes_f == _permute(deep)[0].bytes_f
