"""The embedding's and the output's priced op graphs are cached on what they read of the shapes (``_edge_key``), not
on the whole shapes: only where they are equal."""
from __future__ import annotations

import random

import oracle.compute as compute
from oracle.config import RunConfig
from oracle.opgraph import Shapes
from searchers.space import SearchSpace


def edge_sample_runs() -> list[RunConfig]:
    """Runs whose shapes differ in every way the edges could read: samples of three spaces (MoE and dense,
    TP/CP/EP/MBS/precision/dispatcher), TorchTitan eager and compiled, unfused accumulation, MXFP8 logits, fp32
    gradient reduction (also tests/oracle/test_activations_opgraph.py's)."""
    specs = [("mixtral-8x22b", "mi355x", 32, {"seq_len": 4096, "gbs": 256}),
             ("deepseek-v2-lite", "h100-sxm", 16, {"seq_len": 2048, "gbs": 128}),
             ("llama3-8b", "b200", 8, {"seq_len": 8192, "gbs": 64})]
    runs = []
    for model, hw, n, t in specs:
        base = RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": t})
        sp = SearchSpace(base, restrict={"precision": ["bf16", "fp8"]})
        runs += [sp.run_of(p) for p in random.Random(1).sample(sp.points, min(150, len(sp.points)))]
    tt = RunConfig.from_dict({"model": "llama3-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                              "training": {"seq_len": 4096, "gbs": 32, "framework": "torchtitan", "fsdp": True}})
    runs += [tt, tt.with_training(torch_compile=True), tt.with_training(gradient_accumulation_fusion=False)]
    runs += [runs[0].with_training(fp8_output_proj=True, precision="fp8"), runs[0].with_training(grad_reduce_in_fp32=True)]
    return runs


def test_edges_priced_once_per_edge_key_equal_their_own_pricing():
    compute._EDGE_SUMS.clear()
    shapes = {}
    for r in edge_sample_runs():
        shapes.setdefault((r.cluster.hardware, Shapes.of(r)), r)
    keys = {(hw, compute._edge_key(s)) for hw, s in shapes}
    assert len(shapes) > 2 * len(keys)  # shared often
    assert len({k[1][2:] for k in keys}) >= 4  # kernels, logits dtype and wgrad traffic of several kinds
    for (hw, s), r in shapes.items():
        card, tp = r.model, r.training.tp
        for which, args in (("embedding", ()), ("output", (card.padded_vocab(tp) // tp, True)),
                            ("output", (card.padded_vocab(tp) // tp, False))):
            assert compute._edge_sums(hw, card, s, which, *args) == compute._price_edge(hw, card, s, which, *args)
