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
