"""Context-parallel communication types (TrainingConfig.cp_comm_type, Megatron-Core's cp_comm_type): ring p2p
overlapped with the attention, Ulysses all-to-alls and the K,V all-gather on the critical path."""
from __future__ import annotations

import pytest

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.layout import Layout
from oracle.projector import comm_model, project
from oracle.recipe import megatron_args, read_recipe, split_megatron_args


def _run(cp_comm_type: str = "p2p", model: str = "llama3-8b", hardware: str = "h100-sxm", num_gpus: int = 16,
         **training) -> RunConfig:
    training = {"seq_len": 32768, "gbs": 16, "mbs": 1, "tp": 2, "cp": 8, **training, "cp_comm_type": cp_comm_type}
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hardware, "num_gpus": num_gpus},
                                "training": training})


def _cp(p) -> tuple[float, float]:
    part = next(c for c in p.breakdown.comm if c.kind == "cp")
    return part.exposed_s, part.total_s


def test_a2a_moves_qkv_in_and_the_output_out_on_the_critical_path():
    run = _run("a2a", cp=2, tp=1, num_gpus=2, gbs=2)
    p = project(run)
    exposed, total = _cp(p)
    assert total > 0 and exposed == pytest.approx(total)  # nothing overlaps it
    # the bytes: per layer, Q + K + V to head sharding, the output back (forward); the backward mirrors them
    m, T = run.model, run.training.mbs * run.training.seq_len // 2
    comm = comm_model(run.cluster.hardware, run.cluster.num_gpus)
    g = Layout(run).group("cp")
    qkv = 2 * T * (m.num_attention_heads + 2 * m.kv_heads) * m.head_size
    out = 2 * T * m.num_attention_heads * m.head_size
    per_pass = comm.cost("all_to_all", g, qkv).time_s + comm.cost("all_to_all", g, out).time_s
    micro = run.training.gbs // run.training.mbs  # dp = 2 GPUs / cp 2 = 1
    assert total == pytest.approx(2 * per_pass * m.num_layers * micro, rel=1e-6)


def test_the_ring_hides_behind_long_attention_and_the_others_do_not():
    ring, a2a, ag = (project(_run(k, cp=4)) for k in ("p2p", "a2a", "all_gather"))
    assert _cp(ring)[0] < _cp(ring)[1]  # each step overlaps the block in hand
    assert _cp(a2a)[0] == pytest.approx(_cp(a2a)[1]) and _cp(ag)[0] == pytest.approx(_cp(ag)[1])
    # compute and memory do not depend on how K,V travel
    assert a2a.breakdown.compute_s == pytest.approx(ring.breakdown.compute_s)
    assert a2a.memory.peak_bytes == ring.memory.peak_bytes == ag.memory.peak_bytes


def test_a2a_needs_whole_heads_per_cp_rank_and_megatron():
    with pytest.raises(InvalidConfigError, match="its 4 key/value heads do not split into 8"):
        _run("a2a")  # llama3-8b: 8 KV heads / tp 2 = 4 per rank, cp 8
    with pytest.raises(InvalidConfigError, match="cp_comm_type=a2a is Megatron-Core's; framework=torchtitan"):
        _run("a2a", cp=2, tp=1, num_gpus=2, gbs=2, framework="torchtitan")
    assert project(_run("a2a", cp=4)).tokens_per_s_per_gpu > 0


def test_the_recipe_and_the_launch_line_read_it_and_the_export_writes_it():
    assert read_recipe({"cp_comm_type": "a2a"}).training == {"cp_comm_type": "a2a"}
    assert read_recipe({"cp_comm_type": "allgather"}).training == {"cp_comm_type": "all_gather"}
    assert read_recipe({"cp_comm_type": ["a2a"] * 4}).training == {"cp_comm_type": "a2a"}
    assert read_recipe(split_megatron_args("--cp-comm-type a2a")).training == {"cp_comm_type": "a2a"}
    with pytest.raises(InvalidConfigError, match="hierarchical a2a\\+p2p is not priced"):
        read_recipe({"cp_comm_type": "a2a+p2p"})
    with pytest.raises(InvalidConfigError, match="one communication type per layer is not priced"):
        read_recipe({"cp_comm_type": ["a2a", "p2p"]})
    t = _run("a2a", cp=4).training
    written = dict(megatron_args(t))
    assert written["cp_comm_type"] == ["a2a"]
    assert read_recipe(list(written.items())).training["cp_comm_type"] == "a2a"
    assert "cp_comm_type" not in dict(megatron_args(_run().training))
