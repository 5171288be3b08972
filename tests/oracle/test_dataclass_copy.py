"""replace_fast builds the same objects as dataclasses.replace (issue 27: the op-graph builders' copies)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.activations import Module
from oracle.config import RunConfig
from oracle.dataclass_copy import replace_fast
from oracle.opgraph import Op, Saved, Shapes, layer_ops

MOE = {"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
       "training": {"seq_len": 8192, "gbs": 512, "pp": 4, "ep": 8, "precision": "fp8"}}


def _ops() -> list[Op]:
    run = RunConfig.from_dict(MOE)
    return layer_ops(run.model, Shapes.of(run), "moe")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_replace_fast_equals_replace_on_ops(data):
    op = data.draw(st.sampled_from(_ops()))
    changes = data.draw(st.dictionaries(st.sampled_from(["block", "name", "dtype"]), st.text(max_size=5))
                        | st.fixed_dictionaries({"wgrad_c_bytes": st.floats(0, 8), "groups": st.integers(1, 9)}))
    got, want = replace_fast(op, **changes), replace(op, **changes)
    assert got == want and type(got) is type(want)
    assert all(getattr(got, f) == getattr(want, f) for f in Op.__dataclass_fields__)


def test_replace_fast_falls_back_where_init_does_more():
    t = Saved("x", 4.0)  # has __post_init__ (validation): dataclasses.replace runs it
    assert replace_fast(t, bytes=8.0) == replace(t, bytes=8.0)
    with pytest.raises(TypeError):
        replace_fast(Module("m", 1.0), nope=1)  # an unknown field: dataclasses.replace's own error

    @dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("x < 0")
    with pytest.raises(ValueError):
        replace_fast(Checked(1), x=-1)


@pytest.mark.parametrize("slots", [True, False])
@pytest.mark.parametrize("frozen", [True, False])
def test_replace_fast_sets_every_field_with_or_without_slots(slots, frozen):
    @dataclass(frozen=frozen, slots=slots)
    class Plain:
        a: int
        b: str = "x"
        c: float = 0.5

    obj = Plain(1, "y", 2.0)
    for changes in ({}, {"a": 3}, {"b": "z", "c": -1.0}, {"a": 0, "b": "", "c": 0.0}):
        got = replace_fast(obj, **changes)
        assert got == replace(obj, **changes) and got is not obj and type(got) is Plain
    assert obj == Plain(1, "y", 2.0)  # the original untouched


def test_shapes_hash_once_as_their_fields_and_a_copy_in_another_process_hashes_itself_again():
    """Shapes and the activations Shape cache their hash (HashedOnce); Shapes.of and shape_of share one instance per
    value; a replaced, pickled or copied shape hashes its own fields, and a pickle read in a process whose string
    hashes differ hashes as that process's own shape does."""
    import copy
    import os
    import pickle
    import subprocess
    import sys
    from dataclasses import fields

    from oracle.activations import shape_of
    run = RunConfig.from_dict(MOE)
    s = shape_of(run)
    g = s.graph
    assert Shapes.of(run) is Shapes.of(RunConfig.from_dict(MOE)) and shape_of(RunConfig.from_dict(MOE)) is s
    for obj in (g, s):
        assert hash(obj) == hash(tuple(getattr(obj, f.name) for f in fields(obj) if f.compare))
        for other in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
            assert other == obj and hash(other) == hash(obj)
    bf16 = replace(g, dtype="bf16", attention_dtype="bf16")
    assert bf16 != g and hash(bf16) == hash(tuple(getattr(bf16, f.name) for f in fields(bf16) if f.compare))
    code = ("import pickle, sys; from oracle.activations import shape_of; from oracle.config import RunConfig; "
            f"s = pickle.loads(sys.stdin.buffer.read()); t = shape_of(RunConfig.from_dict({MOE!r})); "
            "print(s == t and hash(s) == hash(t) and hash(s.graph) == hash(t.graph))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(s), capture_output=True, env=env,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.decode().strip() == "True"


@pytest.mark.parametrize("model,kind", [("mixtral-8x22b", "moe"), ("deepseek-v3", "moe"), ("llama3.1-8b", "dense"),
                                        ("gpt-oss-120b", "moe"), ("gpt-oss-120b", "dense")])
def test_layer_builders_make_fresh_ops_and_tagging_them_in_place_equals_copying(model, kind):
    """_build_layer_ops tags the builders' ops with their block and wgrad traffic in place: that is only sound
    while every builder returns ops made on that call (none shared between calls or within a list), and it
    must give the ops copying them would."""
    from oracle.opgraph import (ATTN, EXPERTS, GEMM, MLP, ROUTER, ROUTER_OPS, _build_layer_ops, attention_ops,
                                dense_mlp_block_ops, moe_ops)
    run = RunConfig.from_dict({"model": model, "cluster": {"hardware": "mi355x", "num_gpus": 64},
                               "training": {"seq_len": 4096, "gbs": 512, "tp": 2, "ep": 8 if kind == "moe" else 1,
                                            "precision": "fp8"}})
    card, s = run.model, Shapes.of(run)
    if kind == "moe" and not card.is_moe:
        pytest.skip("dense card")

    def build():
        out = [(op, ATTN) for op in attention_ops(card, s, card.sliding_window)]
        if kind == "moe":
            return out + [(op, ROUTER if op.name in ROUTER_OPS else EXPERTS) for op in moe_ops(card, s)]
        return out + [(op, MLP) for op in dense_mlp_block_ops(card, s)]
    first, second = build(), build()
    assert len({id(op) for op, _ in first}) == len(first)  # no op twice in one list
    assert not {id(op) for op, _ in first} & {id(op) for op, _ in second}  # none shared between calls
    want = [replace(op, block=b, **({"wgrad_c_bytes": s.wgrad_c_bytes} if op.kind == GEMM and op.has_wgrad else {}))
            for op, b in second]
    assert _build_layer_ops(card, s, kind, card.sliding_window) == want


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fast_init_sets_every_field_as_the_dataclass_init_would(data):
    """Op's generated __init__ (dataclass_copy.fast_init): each given field set, every other at its default, the same
    keyword-only signature and errors; a class whose __init__ does more (Saved's __post_init__) is left alone."""
    from dataclasses import MISSING, fields

    from oracle.dataclass_copy import fast_init
    op = data.draw(st.sampled_from(_ops()))
    given_names = data.draw(st.sets(st.sampled_from([f.name for f in fields(Op) if f.default is not MISSING])))
    kw = {"name": op.name, "kind": op.kind, **{n: getattr(op, n) for n in given_names}}
    built = Op(**kw)
    for f in fields(Op):
        assert getattr(built, f.name) == kw.get(f.name, f.default)
    assert Op.__init__.__qualname__ == "Op.__init__" and "_s0" in Op.__init__.__code__.co_names
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'name'"):
        Op(kind=op.kind)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        Op(name="x", kind=op.kind, bogus=1)
    assert fast_init(Saved) is Saved and Saved.__init__.__qualname__ == "Saved.__init__"
    assert Saved("x", 4).bytes == 4.0  # its __post_init__ still runs
